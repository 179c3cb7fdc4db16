"""Token recycling: the target's own top-k next tokens after each token, kept from the steps already run, as a
candidate tree (Luo et al., "Turning Trash into Treasure: Accelerating Inference of Large Language Models with
Token Recycling", 2024).

Every verified step computes the target's logits at the rows its sequences went through; their top k says what the
model thought could follow each of those tokens. The next time a token occurs, its last top k are guesses of what
follows it, and theirs of what follows them: a tree drafted without a draft model and without the text having
shown the continuation before, which is what prompt lookup, the n-gram pools and the suffix trees need. Chat text
repeats itself little, so this is the source that still proposes there.

One table for all requests (an engine's `TokenRecycler`), keyed by token: at most one entry per vocabulary token
(top_k token ids each). A guess's conditional estimate is how often the token that followed was at that rank of
the table's entry, counted over every row seen.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

# Top tokens kept per token: the rank estimates fall fast (rank 8 is rarely right), and each kept rank is a
# candidate child of every node.
TOP_K = 8
# Pseudo-observations behind the rank estimates before any were counted, and those estimates: the right token at
# rank r of the entry, 0.5 / 2^r.
PRIOR_WEIGHT = 20.0


class TokenRecycler:
    __slots__ = ("top_k", "table", "_hits", "_tries", "_estimates")

    def __init__(self, top_k: int = TOP_K) -> None:
        self.top_k = top_k
        self.table: dict[int, tuple[int, ...]] = {}
        self._hits = [PRIOR_WEIGHT * 0.5 / 2**r for r in range(top_k)]
        self._tries = PRIOR_WEIGHT
        self._estimates: list[float] | None = None  # rank_estimates, until the next observation

    def rank_estimates(self) -> list[float]:
        """Per rank r: how often the token that followed a token was at rank r of its entry."""
        if self._estimates is None:
            self._estimates = [h / self._tries for h in self._hits]
        return self._estimates

    def best_estimate(self, scale: float = 1.0) -> float:
        """The most a guess's own min(1, scale * estimate) can be: no guess scores more, wherever it hangs."""
        return min(1.0, scale * max(self.rank_estimates()))

    def observe(self, tokens: Sequence[int], top: Sequence[Sequence[int]], following: Sequence[int]) -> None:
        """The target's top tokens `top[i]` (best first) at a position holding `tokens[i]`, where `following[i]`
        then came: first counted against the token's entry as it stood, then its new entry."""
        table, k = self.table, self.top_k
        self._estimates = None
        for tok, row, nxt in zip(tokens, top, following, strict=True):
            old = table.get(tok)
            if old is not None:
                self._tries += 1.0
                for r, t in enumerate(old):
                    if t == nxt:
                        self._hits[r] += 1.0
                        break
            table[tok] = tuple(row[:k])

    def candidates(
        self, x0: int, max_nodes: int, floor: float = 0.0, scale: float = 1.0
    ) -> list[tuple[list[int], list[float]]]:
        """The best `max_nodes` nodes after x0, as root-to-leaf paths, each token with its conditional estimate (its
        rank's), best first by the product of min(1, scale * estimate) along the path (`scale`: the most the
        caller's calibration multiplies an estimate by). A guess whose own min(1, scale * estimate) is at most
        `floor` is left out: it scores no more than that wherever it hangs, even below a parent another source made
        certain."""
        if max_nodes <= 0 or x0 not in self.table or self.best_estimate(scale) <= floor:
            return []
        est = self.rank_estimates()
        cond = [min(1.0, scale * e) for e in est]
        # Ranks best estimate first: a node's next sibling in this order is its best untaken one, so each node taken
        # pushes only its first child and its next sibling (the heap never holds a node that cannot come next).
        order = sorted(range(len(est)), key=lambda r: -cond[r])
        table = self.table
        # (-bound, tie-break, parent's bound, position in `order`, path tokens, path estimates)
        heap: list[tuple[float, int, float, int, tuple[int, ...], tuple[float, ...]]] = []
        count = 0

        def push(parent_bound: float, parent: tuple[int, ...], parent_ests: tuple[float, ...], i: int) -> None:
            nonlocal count
            row = table.get(parent[-1] if parent else x0)
            while row is not None and i < len(order) and order[i] >= len(row):
                i += 1  # a shorter entry (fewer tokens than top_k) lacks this rank
            if row is None or i >= len(order):
                return
            r = order[i]
            if cond[r] > floor:  # else neither it nor a later sibling clears the floor
                count += 1
                bound = parent_bound * cond[r]
                heapq.heappush(heap, (-bound, count, parent_bound, i, (*parent, row[r]), (*parent_ests, est[r])))

        push(1.0, (), (), 0)
        nodes: list[tuple[tuple[int, ...], tuple[float, ...]]] = []
        while heap and len(nodes) < max_nodes:
            neg, _, parent_bound, i, path, ests = heapq.heappop(heap)
            nodes.append((path, ests))
            push(parent_bound, path[:-1], ests[:-1], i + 1)  # its next sibling
            push(-neg, path, ests, 0)  # its best child
        inner = {path[:-1] for path, _ in nodes}
        return [(list(path), list(ests)) for path, ests in nodes if path not in inner]
