"""How many tree nodes each request's step carries: as many as raise the expected tokens per second.

A step's requests yield R tokens for sure plus, in expectation, the scores of their draft nodes (each node's
probability of being accepted, times its request's `AcceptanceStats.calibration`: `scales`). With c the step's cost
(`cost.StepCost`), adding a node of score p pays iff (Y + p) / (c + m) > Y / c, i.e. p > Y * m / c, where Y is the
yield so far and m the price of one more token (`StepCost.marginal`). The cost is convex in the drafts, so the bar
only rises as nodes are taken and the first node that does not pay ends the search. `choose_sizes` adds nodes across
all requests in descending score while they pay: small trees where tokens are dear (a CPU, a large batch), large ones
where they are nearly free (a GPU, or a CPU below its knee), none where nothing is likely enough. `plan_step` weighs
the trees against each request's best chain alone, which saves the branch price.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from vllm_lookahead.core.cost import StepCost
from vllm_lookahead.core.tree import StepTree


def score_floor(cost: StepCost, requests: int) -> float:
    """The bar a node's score must clear before `choose_sizes` takes any node, in any plan of `plan_step`: the bar
    only rises as nodes are taken (a node raises it exactly when it clears it), so no node scoring at or below
    this is ever taken, and the sources need not draft such nodes at all (at a large batch on a CPU, most of
    them)."""
    return requests * cost.marginal(requests, 0) / cost.seconds(requests, 0, branched=True)


@dataclass
class Sizes:
    sizes: list[int]  # nodes (root included, >= 1) to keep of each tree
    expected: float  # tokens the step is expected to yield
    seconds: float  # what it is expected to cost

    @property
    def rate(self) -> float:
        return self.expected / self.seconds


def choose_sizes(
    trees: Sequence[StepTree],
    caps: Sequence[int],
    requests: int,
    cost: StepCost,
    budget: int,
    branched: bool = False,
    scales: Sequence[float] | None = None,
) -> Sizes:
    """Nodes (root included, >= 1) to keep of each tree (each ordered best first, `StepTree.by_score`).

    caps[i]: most nodes tree i may keep; requests: the step's decoding requests (lookahead's trees and others,
    each yields its x0's token); budget: most non-root nodes in all; branched: price the step with the branch
    cost from its first node on (the trees may branch); scales[i]: what tree i's scores are worth (its request's
    calibration; default 1).
    """
    model = cost.coefficients()
    seconds = model.seconds(requests, 0, branched)
    sizes = [1] * len(trees)
    expected = float(requests)
    scale = [1.0] * len(trees) if scales is None else scales
    # (negated worth, tree): always the best node not yet taken whose parent is taken (trees are ordered best
    # first, so each tree offers its next node).
    heap = [(-t.scores[1] * scale[i], i) for i, t in enumerate(trees) if t.num_nodes > 1 and caps[i] > 1]
    heapq.heapify(heap)
    added = 0
    while heap and added < budget:
        neg, i = heapq.heappop(heap)
        p = -neg
        price = model.marginal(requests, added)
        if p * seconds <= expected * price:
            break  # the best remaining node does not pay, so no other does (the bar only rises)
        sizes[i] += 1
        added += 1
        seconds += price
        expected += p
        t = trees[i]
        if sizes[i] < min(t.num_nodes, caps[i]):
            heapq.heappush(heap, (-t.scores[sizes[i]] * scale[i], i))
    if not added:
        seconds = model.seconds(requests, 0)  # plain decoding: no branch to pay for
    return Sizes(sizes, expected, seconds)


def plan_step(
    trees: Sequence[StepTree],
    caps: Sequence[int],
    requests: int,
    cost: StepCost,
    budget: int,
    scales: Sequence[float] | None = None,
) -> tuple[list[StepTree], list[int]]:
    """The step's trees and their sizes: each request's best chain alone (`StepTree.best_chain`), or the trees
    themselves where what their branches add is worth the branch price. Either way no better plan than plain
    decoding is passed over: a node is only taken when it pays."""
    if cost.coefficients().branch <= 0:  # no branch price: the trees hold the chains and more
        return list(trees), choose_sizes(trees, caps, requests, cost, budget, scales=scales).sizes
    chains = [t.best_chain() for t in trees]
    by_chain = choose_sizes(chains, caps, requests, cost, budget, scales=scales)
    by_tree = choose_sizes(trees, caps, requests, cost, budget, branched=True, scales=scales)
    # A best-first prefix without a branch is the best chain's prefix: then the chains, priced without the branch.
    branches = any(not t.prefix_is_chain(k) for t, k in zip(trees, by_tree.sizes, strict=True))
    if branches and by_tree.rate > by_chain.rate:
        return list(trees), by_tree.sizes
    return chains, by_chain.sizes
