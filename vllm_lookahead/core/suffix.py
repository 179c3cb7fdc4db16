"""Suffix-tree candidates: what followed the current context's last tokens in this request's prompt and output, and
in earlier requests' outputs (the suffix trees of `arctic_inference`, the library behind vLLM's `suffix` method).

vLLM verifies only one linear chain of a suffix speculation; here the whole speculation tree hangs in the step tree,
each node scored by the library's own estimate of its path's probability.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from vllm_lookahead.core.tree import Candidate, Source

logger = logging.getLogger("vllm_lookahead")
_said_missing = False
# The library speculates at most SPEC_FACTOR tokens per matched context token, as vLLM's suffix method does. Longer
# speculation on short matches (2) offers deep nodes whose scores run high: `benchmarks/research/replay_trees.py
# --spec-factor F` (20 prompts of each set, 2026-12-06), tokens per modelled second at F = 1 over F = 2, HumanEval /
# ShareGPT: 4 requests in flight +1.9% / +0.6%, 16 +1.9% / +1.1%, 64 +0.0% / +0.6%; one request 0.0% / +0.4% under a
# knee (`--knee 6`), -0.8% / 0.0% on a straight line. F = 1.5 fell between.
SPEC_FACTOR = 1.0
# A speculation matched on at most this many context tokens is Source.SUFFIX_SHORT, learned apart: the library's
# estimates there come from the counts after one or two tokens of context and run high, those of long matches run
# low, and one factor per depth over both mixed them. `benchmarks/replay_trees.py --fixed 0.05 --per-token 0.003`:
# 5.6 instead of 6.0 draft nodes a step on HumanEval and 3.3 instead of 3.5 on ShareGPT for 2.81 / 1.66 tokens a step
# instead of 2.83 / 1.67 (+1.0% / +0.4% tokens per modelled second; a limit of 1-6 tokens gave the same).
# A calibration run (float32, 10 prompts) then had first tokens accepted 0.72 / 0.22 (HumanEval / ShareGPT) where scored
# 0.73 / 0.34 on long matches, 0.30 / 0.21 where scored 0.25 / 0.22 on short ones.
SHORT_MATCH = 2


class SuffixCandidates:
    """One per engine: a local suffix tree per active request and a global one over finished requests' outputs."""

    def __init__(self, max_depth: int, max_cached_requests: int, min_prob: float = 0.05) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.max_depth = max_depth
        self.min_prob = min_prob
        # max_cached_requests=0 keeps no global tree: this request's prompt and output only.
        self._cache: Any = SuffixDecodingCache(max_tree_depth=max_depth, max_cached_requests=max_cached_requests)
        # output tokens of each request the global tree holds, in the library's order (it evicts the oldest first)
        self._held: dict[Hashable, int] = {}

    @classmethod
    def create(cls, max_depth: int, max_cached_requests: int) -> SuffixCandidates | None:
        """None (said once in the log) when arctic_inference is not installed: the source is then off."""
        global _said_missing
        try:
            return cls(max_depth, max_cached_requests)
        except ImportError:
            if not _said_missing:
                _said_missing = True
                logger.warning(
                    "lookahead: suffix-tree candidates are off because arctic_inference is not installed "
                    "(pip install 'vllm-lookahead[suffix]')"
                )
            return None

    def start(self, req_id: Hashable, prompt: Sequence[int]) -> None:
        cache = self._cache
        if req_id in cache.active_requests:
            cache.stop_request(req_id)
        if req_id in cache.cached_requests:  # a request id seen before (preempted and resumed): start afresh
            cache.evict_cached_response(req_id)
        self._held.pop(req_id, None)
        cache.start_request(req_id, np.asarray(prompt, dtype=np.int32))  # may evict the oldest cached outputs
        held = cache.cached_requests
        while self._held and next(iter(self._held)) not in held:
            del self._held[next(iter(self._held))]
        if req_id in held:
            self._held[req_id] = 0

    def extend(self, req_id: Hashable, tokens: Sequence[int]) -> None:
        """The request's new output tokens (they also become candidates for other requests)."""
        if tokens:
            self._cache.add_active_response(req_id, np.asarray(tokens, dtype=np.int32))
            if req_id in self._held:
                self._held[req_id] += len(tokens)

    def stop(self, req_id: Hashable) -> None:
        """The request ended: its prompt goes, its output stays in the global tree (up to max_cached_requests)."""
        if req_id in self._cache.active_requests:
            self._cache.stop_request(req_id)

    def seed(self, outputs: Sequence[Sequence[int]]) -> None:
        """Token sequences held in the global tree as finished outputs (the suffix corpus), oldest first: they count
        in max_cached_requests, so later requests' outputs evict them first."""
        for i, tokens in enumerate(outputs):
            req_id = ("corpus", i)
            self.start(req_id, [])
            self.extend(req_id, tokens)
            self.stop(req_id)

    def cached_requests(self) -> int:
        """Requests whose outputs the global tree holds, the running ones included (at most max_cached_requests)."""
        return len(self._cache.cached_requests)

    def cached_tokens(self) -> int:
        """Output tokens the global tree holds: about 210 bytes of memory each at the default depth
        (`python benchmarks/suffix_cache_memory.py`). max_cached_requests bounds the requests, their lengths the
        rest."""
        return sum(self._held.values())

    def candidates(self, req_id: Hashable, context: Sequence[int], max_tokens: int) -> list[Candidate]:
        """Root paths of the speculation tree after `context` (the sequence's last tokens, x0 included), at most
        max_tokens nodes in all; each node scored with the library's estimate of its path's probability."""
        if max_tokens <= 0:
            return []
        ctx = np.asarray(context[-self.max_depth :], dtype=np.int32)
        draft = self._cache.speculate(
            req_id,
            ctx,
            max_spec_tokens=max_tokens,
            max_spec_factor=SPEC_FACTOR,
            min_token_prob=self.min_prob,
            use_tree_spec=True,
        )
        source = Source.SUFFIX if draft.match_len > SHORT_MATCH else Source.SUFFIX_SHORT
        return tree_to_paths(draft.token_ids, draft.parents, draft.probs, source)


def tree_to_paths(
    tokens: Sequence[int], parents: Sequence[int], probs: Sequence[float], source: Source = Source.SUFFIX
) -> list[Candidate]:
    """A speculation tree (parents[i] < i, -1 under the root) as the root paths to its leaves, best leaf first,
    each from `source`."""
    n = len(tokens)
    is_parent = [False] * n
    for p in parents:
        if p >= 0:
            is_parent[p] = True
    paths: list[Candidate] = []
    for leaf in sorted((i for i in range(n) if not is_parent[i]), key=lambda i: -probs[i]):
        chain = []
        u = leaf
        while u >= 0:
            chain.append(u)
            u = parents[u]
        chain.reverse()
        # The library's path probabilities, and from them its conditional estimate per token.
        path = [float(probs[u]) for u in chain]
        conds = [min(1.0, p / q) if q > 0 else 0.0 for p, q in zip(path, [1.0, *path[:-1]], strict=True)]
        paths.append(Candidate([int(tokens[u]) for u in chain], path, source, conds))
    return paths
