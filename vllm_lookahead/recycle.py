"""Token recycling: the target's own top-k next tokens after each token, kept from the steps already run, as a
candidate tree (Luo et al., "Turning Trash into Treasure: Accelerating Inference of Large Language Models with
Token Recycling", 2024).

Every verified step computes the target's logits at the rows its sequences went through; their top k says what the
model thought could follow each of those tokens. The next time a token occurs, its last top k are guesses of what
follows it, and theirs of what follows them: a tree drafted without a draft model and without the text having
shown the continuation before, which is what prompt lookup, the n-gram pools and the suffix trees need. Chat text
repeats itself little, so this is the source that still proposes there.

One table per context length for all requests (an engine's `TokenRecycler`): the top k after a token, after the two
tokens ending there, and after the three; a guess comes from the longest context the tables hold (the paper keys
by the token alone). The longer context is the sharper guess: on the greedy outputs of 60 prompts a set (the
target's top 8 at every position, as `benchmarks/replay_trees.py --generate` saves them), the model's next token
was the entry's first guess 42% of the time after one token, 65% after two and 73% after three (ShareGPT), and
backing off from three to one gets the first guess right at 42% of all positions instead of 34% (HumanEval: 50%
instead of 38%). A guess's conditional estimate is how often the token that followed was at that rank of an entry
of that context length, counted over every row seen. The unigram table holds at most one entry per vocabulary token;
the longer ones at most `max_contexts` each, the least recently written dropped first.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Sequence

# Top tokens kept per context: the rank estimates fall fast (rank 8 is rarely right), and each kept rank is a
# candidate child of every node.
TOP_K = 8
# The longest context a guess is keyed by (1: the token alone, as in the paper).
ORDER = 2
# Entries per table of two or more tokens of context: about 200 bytes each, so ORDER = 3 holds at most about 26 MB.
MAX_CONTEXTS = 1 << 16


def default_order() -> int:
    """ORDER, or the token alone with VLLM_LOOKAHEAD_RECYCLE_PAIRS=0 (the pairs' before/after in a benchmark)."""
    return 1 if os.environ.get("VLLM_LOOKAHEAD_RECYCLE_PAIRS", "1") == "0" else ORDER


# Pseudo-observations behind the rank estimates before any were counted, and those estimates: the right token at
# rank r of the entry, 0.5 / 2^r.
PRIOR_WEIGHT = 20.0


class TokenRecycler:
    __slots__ = ("top_k", "order", "max_contexts", "table", "contexts", "_hits", "_tries", "_estimates", "_ranked")

    def __init__(self, top_k: int = TOP_K, order: int | None = None, max_contexts: int = MAX_CONTEXTS) -> None:
        """`order`: the longest context a guess is keyed by (default: `default_order()`)."""
        order = default_order() if order is None else order
        if order < 1:
            raise ValueError(f"lookahead: recycling's context length must be >= 1 (got {order})")
        self.top_k = top_k
        self.order = order
        self.max_contexts = max_contexts
        self.table: dict[int, tuple[int, ...]] = {}  # after one token
        # contexts[L - 2]: after the L tokens of the key, L = 2..order (oldest written first)
        self.contexts: list[dict[tuple[int, ...], tuple[int, ...]]] = [{} for _ in range(order - 1)]
        # per context length (index L - 1): hits per rank, rows counted
        self._hits = [[PRIOR_WEIGHT * 0.5 / 2**r for r in range(top_k)] for _ in range(order)]
        self._tries = [PRIOR_WEIGHT] * order
        # rank_estimates per context length, and the ranks best estimate first: until the next observation
        self._estimates: list[list[float]] | None = None
        self._ranked: dict[float, list[tuple[list[float], list[int]]]] = {}

    def rank_estimates(self, length: int = 1) -> list[float]:
        """Per rank r: how often the token that followed a context of `length` tokens was at rank r of its entry."""
        if self._estimates is None:
            self._estimates = [[h / t for h in hits] for hits, t in zip(self._hits, self._tries, strict=True)]
        return self._estimates[length - 1]

    def best_estimate(self, scale: float = 1.0) -> float:
        """The most a guess's own min(1, scale * estimate) can be: no guess scores more, wherever it hangs."""
        return min(1.0, scale * max(max(self.rank_estimates(n)) for n in range(1, self.order + 1)))

    def _entry(self, ctx: Sequence[int]) -> tuple[tuple[int, ...] | None, int]:
        """The entry of the longest context the tables hold that `ctx` ends with, and that context's length."""
        for n in range(min(self.order, len(ctx)), 1, -1):
            row = self.contexts[n - 2].get(tuple(ctx[-n:]))
            if row is not None:
                return row, n
        return (self.table.get(ctx[-1]), 1) if ctx else (None, 1)

    def observe(
        self,
        tokens: Sequence[int],
        top: Sequence[Sequence[int]],
        following: Sequence[int],
        before: Sequence[int] = (),
    ) -> None:
        """The target's top tokens `top[i]` (best first) at a position holding `tokens[i]`, where `following[i]`
        then came; `before`: the tokens before tokens[0]. Each is first counted against the entry a guess would have
        come from, then written as the entry of every context length."""
        k, cap = self.top_k, self.max_contexts
        self._estimates = None
        self._ranked.clear()
        seq = [*before[len(before) - (self.order - 1) :], *tokens] if self.order > 1 else list(tokens)
        first = len(seq) - len(tokens)
        for i, (row, nxt) in enumerate(zip(top, following, strict=True)):
            end = first + i + 1
            old, n = self._entry(seq[max(0, end - self.order) : end])
            if old is not None:
                self._tries[n - 1] += 1.0
                for r, t in enumerate(old):
                    if t == nxt:
                        self._hits[n - 1][r] += 1.0
                        break
            entry = tuple(row[:k])
            self.table[seq[end - 1]] = entry
            for n in range(2, min(self.order, end) + 1):
                table = self.contexts[n - 2]
                key = tuple(seq[end - n : end])
                table.pop(key, None)  # re-written: the most recent
                table[key] = entry
                if len(table) > cap:
                    del table[next(iter(table))]

    def _ranks(self, scale: float) -> list[tuple[list[float], list[int]]]:
        """Per context length: the conditional scores min(1, scale * estimate) per rank, and the ranks best first."""
        out = self._ranked.get(scale)
        if out is None:
            out = []
            for n in range(1, self.order + 1):
                cond = [min(1.0, scale * e) for e in self.rank_estimates(n)]
                out.append((cond, sorted(range(len(cond)), key=lambda r, c=cond: -c[r])))
            self._ranked[scale] = out
        return out

    def candidates(
        self, x0: int, max_nodes: int, floor: float = 0.0, scale: float = 1.0, before: Sequence[int] = ()
    ) -> list[tuple[list[int], list[float]]]:
        """The best `max_nodes` nodes after x0 (`before`: the tokens before it), as root-to-leaf paths, each token
        with its conditional estimate (its rank's at its context's length), best first by the product of
        min(1, scale * estimate) along the path (`scale`: the most the caller's calibration multiplies an estimate
        by). A guess whose own min(1, scale * estimate) is at most `floor` is left out: it scores no more than that
        wherever it hangs, even below a parent another source made certain."""
        if max_nodes <= 0 or x0 not in self.table or self.best_estimate(scale) <= floor:
            return []
        ranks = self._ranks(scale)
        head = [*before[len(before) - (self.order - 1) :], x0] if self.order > 1 else [x0]
        # (-bound, tie-break, parent's bound, position in its ranks, path tokens, path estimates)
        heap: list[tuple[float, int, float, int, tuple[int, ...], tuple[float, ...]]] = []
        count = 0

        def push(parent_bound: float, parent: tuple[int, ...], parent_ests: tuple[float, ...], i: int) -> None:
            """The parent's child at position i of its entry's ranks, best estimate first: a node's next sibling in
            this order is its best untaken one, so each node taken pushes only its first child and its next
            sibling (the heap never holds a node that cannot come next)."""
            nonlocal count
            row, n = self._entry((*head, *parent)[-self.order :])
            if row is None:
                return
            cond, order = ranks[n - 1]
            while i < len(order) and order[i] >= len(row):
                i += 1  # a shorter entry (fewer tokens than top_k) lacks this rank
            if i >= len(order):
                return
            r = order[i]
            if cond[r] > floor:  # else neither it nor a later sibling clears the floor
                count += 1
                bound = parent_bound * cond[r]
                est = self.rank_estimates(n)[r]
                heapq.heappush(heap, (-bound, count, parent_bound, i, (*parent, row[r]), (*parent_ests, est)))

        push(1.0, (), (), 0)
        nodes: list[tuple[tuple[int, ...], tuple[float, ...]]] = []
        while heap and len(nodes) < max_nodes:
            neg, _, parent_bound, i, path, ests = heapq.heappop(heap)
            nodes.append((path, ests))
            push(parent_bound, path[:-1], ests[:-1], i + 1)  # its next sibling
            push(-neg, path, ests, 0)  # its best child
        inner = {path[:-1] for path, _ in nodes}
        return [(list(path), list(ests)) for path, ests in nodes if path not in inner]
