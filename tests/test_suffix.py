"""Suffix-tree candidates (arctic_inference) as root paths of the step tree."""

from __future__ import annotations

import builtins
import logging

import pytest

from vllm_lookahead.core import suffix as suffix_mod
from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.core.state import LookaheadState
from vllm_lookahead.core.suffix import SuffixCandidates, tree_to_paths
from vllm_lookahead.core.tree import Source


def test_tree_to_paths_gives_leaves_best_first_with_conditional_estimates():
    # 10 -> (11 -> 13), 12 ; probabilities are the library's path probabilities
    paths = tree_to_paths([10, 11, 12, 13], [-1, 0, -1, 1], [0.8, 0.6, 0.2, 0.3])
    assert [list(p.tokens) for p in paths] == [[10, 11, 13], [12]]
    assert list(paths[0].scores) == [0.8, 0.6, 0.3]
    assert list(paths[0].estimates) == pytest.approx([0.8, 0.75, 0.5])
    assert all(p.source == Source.SUFFIX for p in paths)


def test_candidates_continue_the_context_from_prompt_output_and_earlier_requests():
    pytest.importorskip("arctic_inference")
    sc = SuffixCandidates(max_depth=16, max_cached_requests=10)
    text = [1, 2, 3, 4, 5, 6, 7, 8]
    sc.start("a", [9, *text, 9])
    cands = sc.candidates("a", [9, 1, 2, 3], 8)
    assert cands and list(cands[0].tokens[:3]) == [4, 5, 6]
    # an earlier request's output is a candidate for a later request (global tree)
    sc.extend("a", [20, 21, 22, 23, 24])
    sc.stop("a")
    sc.start("b", [30, 31])
    cands = sc.candidates("b", [30, 31, 20, 21], 8)
    assert cands and list(cands[0].tokens[:2]) == [22, 23]  # as long as the match (the library's default)
    # without the global tree, nothing of "a" is left
    local = SuffixCandidates(max_depth=16, max_cached_requests=0)
    local.start("a", [20, 21, 22, 23])
    local.stop("a")
    local.start("b", [30, 31])
    assert local.candidates("b", [30, 31, 20, 21], 8) == []
    # a restarted id (preemption) starts afresh instead of failing
    sc.start("b", [40, 41])
    sc.start("b", [40, 41])


def test_suffix_nodes_hang_in_the_state_tree():
    pytest.importorskip("arctic_inference")
    params = LookaheadParams(lookup_candidates=0, guess_set_size=0, window_size=1, ngram_size=2)
    sc = SuffixCandidates(max_depth=16, max_cached_requests=10)
    prompt = [5, 6, 7, 8, 9, 5, 6]
    state = LookaheadState(params, prompt, suffix=sc, req_id="r")
    tree = state.build_tree(7)
    assert [tree.tokens[v] for v in tree.path(tree.num_nodes - 1)][1:3] == [8, 9]
    assert {tree.sources[u] for u in range(1, tree.num_nodes)} == {Source.SUFFIX}
    state.close()
    assert "r" not in sc._cache.active_requests


def test_missing_library_turns_the_source_off_once(monkeypatch, caplog):
    real_import = builtins.__import__

    def no_arctic(name, *args, **kwargs):
        if name.startswith("arctic_inference"):
            raise ImportError("no arctic_inference here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_arctic)
    monkeypatch.setattr(suffix_mod, "_said_missing", False)
    with caplog.at_level(logging.WARNING, logger="vllm_lookahead"):
        assert SuffixCandidates.create(24, 10) is None
        assert SuffixCandidates.create(24, 10) is None
    assert caplog.text.count("suffix-tree candidates are off") == 1
    # a state without the source still builds trees
    tree = LookaheadState(LookaheadParams(), [1, 2, 3, 1, 2], suffix=None).build_tree(3)
    assert tree.num_nodes > 1


def test_a_speculation_on_a_short_match_is_scored_apart():
    pytest.importorskip("arctic_inference")
    sc = SuffixCandidates(max_depth=16, max_cached_requests=0)
    sc.start("a", [1, 2, 3, 4, 5, 6, 7, 50, 60, 2, 8, 9])
    # the context's last 3 tokens occur in the prompt: a long match (the library matches at most all but one of the
    # context's tokens)
    long = sc.candidates("a", [0, 1, 2, 3], 4)
    assert long and list(long[0].tokens[:2]) == [4, 5]
    assert {c.source for c in long} == {Source.SUFFIX}
    # only the last token (2) occurs: what followed it is a guess from one token of context
    short = sc.candidates("a", [70, 71, 72, 2], 4)
    assert short and {c.source for c in short} == {Source.SUFFIX_SHORT}
    assert {c.tokens[0] for c in short} <= {3, 8}
    # before anything was learned, a short match's estimate counts for less
    from vllm_lookahead.core.acceptance import AcceptanceStats

    stats = AcceptanceStats()
    assert stats.factor(Source.SUFFIX_SHORT, 1) < stats.factor(Source.SUFFIX, 1)


def test_the_shared_tree_keeps_at_most_the_cached_requests_and_counts_their_tokens():
    pytest.importorskip("arctic_inference")
    sc = SuffixCandidates(max_depth=16, max_cached_requests=2)
    assert sc.cached_requests() == sc.cached_tokens() == 0
    for i in range(4):
        sc.start(i, [1, 2, 3])  # the prompt stays out of the shared tree
        sc.extend(i, [100 * i + t for t in range(150)])
        sc.extend(i, [100 * i + 150 + t for t in range(50)])
        sc.stop(i)
        assert sc.cached_tokens() == 200 * min(i + 1, 2)
    assert sc.cached_requests() == 2  # the oldest outputs went
    # a running request's output counts as it grows, and makes room by evicting the oldest
    sc.start("live", list(range(500, 900)))
    assert sc.cached_requests() == 2 and sc.cached_tokens() == 200
    sc.extend("live", [7, 8, 9])
    assert sc.cached_tokens() == 203
    # a restarted id (preemption) starts its output afresh
    sc.start("live", [1, 2])
    sc.extend("live", [5])
    assert sc.cached_requests() == 2 and sc.cached_tokens() == 201
    sc.stop("live")
    # without a shared tree, nothing is held
    local = SuffixCandidates(max_depth=16, max_cached_requests=0)
    local.start("a", [1, 2, 3])
    local.extend("a", [4, 5])
    assert local.cached_requests() == local.cached_tokens() == 0
