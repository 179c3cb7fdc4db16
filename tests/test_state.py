import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.core.acceptance import AcceptanceStats
from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.core.state import LookaheadState
from vllm_lookahead.core.tree import Source, StepTree
from vllm_lookahead.core.verify import greedy_verify
from vllm_lookahead.devtools.rejection_sampling import sample_verify

PERIOD = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]  # repeated tokens: a key alone is ambiguous


def periodic_target(ctx):
    """Greedy next token of a toy model that has memorised one periodic text."""
    return PERIOD[len(ctx) % len(PERIOD)]


def chaotic_target(ctx):
    """A deterministic next token depending on several previous tokens: little for lookahead to find."""
    a, b, c = ([0, 0, 0] + list(ctx))[-3:]
    return (a * 7 + b * 3 + c + len(ctx)) % 11


def greedy_reference(target, prompt, n):
    ctx = list(prompt)
    for _ in range(n):
        ctx.append(target(ctx))
    return ctx[len(prompt) :]


def lookahead_greedy(target, prompt, n, params, merge=True, max_nodes=None):
    """Drive state + tree + greedy_verify like the engine would; returns (tokens, steps, state)."""
    state = LookaheadState(params, prompt, merge=merge)
    context = list(prompt)  # tokens whose KV is cached
    x0 = target(context)  # the prefill's token
    out = [x0]
    steps = 0
    while len(out) < n:
        tree = state.build_tree(x0, max_nodes=max_nodes)
        assert max_nodes is None or tree.num_nodes <= max_nodes
        assert tree.num_nodes <= params.max_tree_nodes
        base = [*context, x0]
        # The target's argmax at node u: the model sees the cache plus u's root path after x0.
        argmax = [target(base + [tree.tokens[v] for v in tree.path(u)[1:]]) for u in range(tree.num_nodes)]
        nodes, toks = greedy_verify(tree, argmax)
        state.update(tree, argmax, toks)
        assert state.x0 == toks[-1]
        context = base + toks[:-1]
        x0 = toks[-1]
        out.extend(toks)
        steps += 1
    assert state.num_steps == steps and state.num_tokens == len(out) - 1
    return out[:n], steps, state


@pytest.mark.parametrize("merge", [True, False])
def test_periodic_exact_and_compresses(merge):
    prompt = PERIOD * 2 + PERIOD[:5]
    n = 200
    params = LookaheadParams()
    out, steps, _ = lookahead_greedy(periodic_target, prompt, n, params, merge=merge)
    assert out == greedy_reference(periodic_target, prompt, n)
    assert n / steps > 1.5


def test_window_alone_compresses_without_pool():
    # G = 0: only the Jacobi window can be accepted; on a periodic text it still converges and pays off.
    prompt = PERIOD[:3]
    params = LookaheadParams(window_size=8, ngram_size=4, guess_set_size=0, pool_from_prompt=False)
    n = 200
    out, steps, _ = lookahead_greedy(periodic_target, prompt, n, params)
    assert out == greedy_reference(periodic_target, prompt, n)
    assert n / steps > 1.5


def test_pool_learns_from_window_without_prompt():
    # Prompt n-grams disabled and the prompt too short to hold a period: the pool must fill from the window.
    prompt = PERIOD[:2]
    params = LookaheadParams(window_size=6, ngram_size=4, guess_set_size=6, pool_from_prompt=False)
    assert len(LookaheadState(params, prompt).pool) == 0
    out, steps, state = lookahead_greedy(periodic_target, prompt, 300, params)
    assert out == greedy_reference(periodic_target, prompt, 300)
    assert len(state.pool) > 0
    # The window alone (G = 0) reaches about 1.75 here; accepted pool n-grams push well past it.
    assert 300 / steps > 2.2


def test_pool_from_prompt_flag():
    prompt = [1, 2, 3, 4, 5, 6]
    seeded = LookaheadState(LookaheadParams(ngram_size=3, lookup_candidates=0), prompt)
    assert seeded.pool.get(1) == [(2, 3)]
    bare = LookaheadState(LookaheadParams(ngram_size=3, pool_from_prompt=False), prompt)
    assert bare.pool.get(1) == []
    tree = seeded.build_tree(1)
    assert [tree.tokens[u] for u in tree.candidate_nodes[0]] == [2, 3]


def test_prompt_lookup_candidates_come_first_and_follow_the_output():
    prompt = [1, 2, 3, 4, 5, 6]
    state = LookaheadState(LookaheadParams(ngram_size=3, lookup_candidates=1, lookup_len=4), prompt)
    tree = state.build_tree(1)
    # x0 = 1 joins the sequence; its earlier occurrence is followed by 2 3 4 5.
    assert [tree.tokens[u] for u in tree.candidate_nodes[0]] == [2, 3, 4, 5]
    argmax = [0] * tree.num_nodes
    state.update(tree, argmax, [2, 9])  # the output went 1 2 9: now "2 9" follows "1 2"
    tree = state.build_tree(9)
    assert state.lookup.tokens == [*prompt, 1, 2, 9]
    assert tree.tokens[0] == 9
    off = LookaheadState(LookaheadParams(lookup_candidates=0), prompt)
    assert off.lookup is None


def test_seed_controls_initial_window():
    prompt = list(range(50))
    a = LookaheadState(LookaheadParams(lookahead_seed=1), prompt).window.rows
    b = LookaheadState(LookaheadParams(lookahead_seed=1), prompt).window.rows
    c = LookaheadState(LookaheadParams(lookahead_seed=2), prompt).window.rows
    assert a == b and a != c
    assert set(a[0][1:]) <= set(prompt)


def test_update_requires_tokens():
    state = LookaheadState(LookaheadParams(), [1, 2, 3])
    tree = state.build_tree(1)
    with pytest.raises(ValueError, match="at least one token"):
        state.update(tree, [0] * tree.num_nodes, [])


@settings(max_examples=40, deadline=None)
@given(
    w=st.integers(1, 5),
    n=st.integers(2, 5),
    g=st.integers(0, 4),
    merge=st.booleans(),
    periodic=st.booleans(),
    max_nodes=st.one_of(st.none(), st.integers(1, 20)),
    prompt_seed=st.integers(0, 1000),
)
def test_greedy_exact_any_params(w, n, g, merge, periodic, max_nodes, prompt_seed):
    # Exactness holds for every shape, merged or not, and with trees cut to any size (window slots missing).
    rng = random.Random(prompt_seed)
    prompt = [rng.randrange(11) for _ in range(rng.randrange(1, 30))]
    target = periodic_target if periodic else chaotic_target
    params = LookaheadParams(window_size=w, ngram_size=n, guess_set_size=g, lookahead_seed=prompt_seed)
    out, steps, _ = lookahead_greedy(target, prompt, 60, params, merge=merge, max_nodes=max_nodes)
    assert out == greedy_reference(target, prompt, 60)
    assert steps <= 60


def test_truncated_trees_still_compress():
    # Cut so that only part of the window survives: lookahead degrades but candidates still get accepted.
    prompt = PERIOD * 2
    params = LookaheadParams(window_size=7, ngram_size=4, guess_set_size=7)
    out, steps, _ = lookahead_greedy(periodic_target, prompt, 150, params, max_nodes=12)
    assert out == greedy_reference(periodic_target, prompt, 150)
    assert 150 / steps > 1.5


def test_sampling_with_one_hot_target_through_state_is_greedy():
    # The sampling path through the same state machinery, at temperature ~0, reproduces greedy decoding.
    prompt = PERIOD * 2
    params = LookaheadParams()
    state = LookaheadState(params, prompt)
    gen = torch.Generator().manual_seed(0)
    context = list(prompt)
    x0 = periodic_target(context)
    out = [x0]
    while len(out) < 100:
        tree = state.build_tree(x0)
        base = [*context, x0]
        argmax = [periodic_target(base + [tree.tokens[v] for v in tree.path(u)[1:]]) for u in range(tree.num_nodes)]
        probs = torch.nn.functional.one_hot(torch.tensor(argmax), 10).float()
        _, toks = sample_verify(tree, probs, gen)
        state.update(tree, argmax, toks)
        context = base + toks[:-1]
        x0 = toks[-1]
        out.extend(toks)
    assert out[:100] == greedy_reference(periodic_target, prompt, 100)
    assert state.num_tokens / state.num_steps > 1.5


def test_memory_is_bounded_over_a_long_generation():
    """30k tokens of a large vocabulary: the pool stays within max_pool_keys keys of at most G values each; the
    prompt-lookup index grows with the sequence (at most 3 keys a token, 4 positions a key), which max_model_len caps;
    the window and the tails keep their fixed sizes."""
    rng = random.Random(0)
    params = LookaheadParams(max_pool_keys=256, suffix_candidates=0)
    prompt = [rng.randrange(50_000) for _ in range(100)]
    state = LookaheadState(params, prompt)
    cols = state.window.num_cols
    seq = list(prompt)
    for _ in range(300):
        seq += [rng.randrange(50_000) for _ in range(100)]
        state.catch_up(len(seq), lambda a, b, s=seq: s[a:b])
        tree = state.build_tree(seq[-1])
        assert tree.num_nodes <= params.max_tree_nodes
    assert state.seen == len(seq) == 30_100
    assert len(state.pool) == params.max_pool_keys  # full, and no more
    assert all(len(v) <= params.guess_set_size for v in state.pool._table.values())
    assert len(state.lookup._index) <= 3 * len(seq)
    assert max(len(p) for p in state.lookup._index.values()) <= 4
    assert len(state.tail) == params.ngram_size - 1 and len(state.recent) <= params.suffix_depth
    assert state.window.num_cols == cols


def test_trees_are_scored_in_hindsight_beyond_what_a_step_verified():
    """A step that verifies only the first two nodes of a long prompt-lookup candidate still teaches the statistics
    that its deeper nodes are accepted (it matches 10+ tokens of context: Source.LOOKUP_LONG): the sequence went on
    through them (scored against the sequence once it decided them, or when the sequence ends)."""
    prompt = list(range(40)) + list(range(10))
    params = LookaheadParams(lookup_candidates=1, lookup_len=8, guess_set_size=0, suffix_candidates=0)
    state = LookaheadState(params, prompt)
    stats = state.stats
    deep = stats.factor(Source.LOOKUP_LONG, 6)
    x0 = 10
    for _ in range(4):
        tree = state.build_tree(x0)
        assert [tree.tokens[u] for u in tree.candidate_nodes[0]] == list(range(x0 + 1, x0 + 9))
        verified = tree.truncate(3)  # what the step carried: x0 and two nodes, both accepted, plus the bonus
        nodes, toks = greedy_verify(verified, [x0 + 1, x0 + 2, x0 + 3] + [0] * (verified.num_nodes - 3))
        assert toks == [x0 + 1, x0 + 2, x0 + 3]
        state.update(verified, [0] * verified.num_nodes, toks)
        x0 = toks[-1]
    assert state.unscored  # the last trees' deep nodes are not decided yet
    state.close()
    assert not state.unscored
    assert stats.factor(Source.LOOKUP_LONG, 6) > deep  # never verified, yet learned as accepted
    prior = AcceptanceStats()
    assert stats.factor(Source.LOOKUP_LONG, 8) > prior.factor(Source.LOOKUP_LONG, 8)
    assert stats.factor(Source.LOOKUP_LONG, 9) == prior.factor(Source.LOOKUP_LONG, 9)  # no node that deep: untouched


@pytest.mark.parametrize("target", [periodic_target, chaotic_target])
def test_hindsight_over_verified_trees_equals_verification(target):
    """Greedy: when every step verifies its whole tree, scoring the trees against the sequence afterwards learns
    exactly what observing each verification does."""
    prompt = PERIOD * 2 + PERIOD[:5]
    params = LookaheadParams(window_size=3, ngram_size=3, suffix_candidates=0)
    learned, seen = AcceptanceStats(), AcceptanceStats()
    state = LookaheadState(params, prompt, stats=learned)
    context = list(prompt)
    x0 = target(context)
    for _ in range(60):
        tree = state.build_tree(x0)
        base = [*context, x0]
        argmax = [target(base + [tree.tokens[v] for v in tree.path(u)[1:]]) for u in range(tree.num_nodes)]
        nodes, toks = greedy_verify(tree, argmax)
        seen._observe_nodes(tree, {0, *nodes}, None)
        state.update(tree, argmax, toks)
        assert not state.unscored  # the bonus token decides a wholly verified tree
        context = base + toks[:-1]
        x0 = toks[-1]
    assert learned._hits == seen._hits and learned._expected == seen._expected
    assert learned._hits != AcceptanceStats()._hits


def test_prompt_lookup_on_a_short_match_is_scored_apart():
    """A lookup candidate that continues only the last token (not the index's longest match) is its own source, so
    its far lower acceptance does not drag down the long matches' scores."""
    params = LookaheadParams(lookup_candidates=2, lookup_len=3, guess_set_size=0, suffix_candidates=0)
    prompt = [1, 2, 3, 4, 5, 6, 9, 2, 3, 7, 8, 0, 5, 3]
    state = LookaheadState(params, prompt)

    def firsts(tree: StepTree) -> dict[int, Source]:
        return {tree.tokens[u]: Source(tree.sources[u]) for u in tree.children(0) if tree.sources[u] != Source.WINDOW}

    # ... 5 3 | 3: "5 3 3" and "3 3" never occurred, "3" did: most recently followed by the x0 itself, before by 7
    assert firsts(state.build_tree(3)) == {3: Source.LOOKUP_SHORT, 7: Source.LOOKUP_SHORT}
    state = LookaheadState(params, [1, 2, 3, 4, 5, 6, 1, 2])
    assert firsts(state.build_tree(3)) == {4: Source.LOOKUP}  # "1 2 3" occurred: the longest match


def test_a_tree_no_node_of_which_clears_the_bar_is_the_root_alone():
    """build_tree returns the root alone, without merging or sorting, where no candidate's first token scores above
    min_score; the state goes on from it as from any tree."""
    params = LookaheadParams(suffix_candidates=0, recycle_candidates=0)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    assert LookaheadState(params, prompt).build_tree(4).num_nodes > 1
    state = LookaheadState(params, prompt)
    tree = state.build_tree(4, min_score=0.999)
    assert (tree.tokens, tree.parents, tree.depths, tree.window_node) == ([4], [-1], [0], {(0, 0): 0})
    assert tree.ancestor_mask().tolist() == [[True]]
    state.update(tree, [1], [1])
    assert state.x0 == 1 and state.num_tokens == 1
    nxt = state.build_tree(1)
    assert nxt.num_nodes > 1 and nxt.tokens[0] == 1
