"""How many tree nodes each request's step carries: as many as raise the expected tokens per second.

A decoding step with R requests and D draft tokens costs c = fixed + per_request * R + per_draft * D + branch * B
seconds, where B is 1 when a scheduled tree branches (`StepCost`, fitted to the engine's own steps, so it follows
the machine, model, dtype and batch). B is the tree attention path's own price: on a CPU a branched tree runs the
tree kernel beside vLLM's kernel on the other rows, layer by layer, where a chain of drafts runs vLLM's kernel
alone. Its requests yield R tokens for sure plus, in expectation, the scores of their draft nodes (each node's
probability of being accepted). Adding a node of score p pays iff (Y + p) / (c + per_draft) > Y / c, i.e.
p > Y * per_draft / c, where Y is the yield so far. `choose_sizes` adds nodes across all requests in descending
score while they pay: small trees where tokens are dear (a CPU, a large batch), large ones where they are nearly
free (a GPU), none where nothing is likely enough. `plan_step` weighs the trees against each request's best chain
alone, which saves the branch price.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vllm_lookahead.tree import StepTree

# Before any step was timed, relative units: a step costs 1 + PRIOR_SLOPE per token it computes.
PRIOR_SLOPE = 0.03
# Weight of the prior on each slope, in steps: enough to keep the first estimates sane, little enough that a few
# hundred steps override it wherever the batch varies what the slope multiplies.
PRIOR_WEIGHT = 2.0
# Where the prior on a slope sits: as if PRIOR_WEIGHT steps had differed by this many requests or drafts.
PRIOR_SPREAD = 8.0
# Weight of the branch price's prior (0), in branched steps. At a large batch trees seldom branch, so a handful of
# branched steps is all the fit sees of the price, and one of them slowed by the machine priced branching out of the
# rest of a run (48.9 ms from 5 branched steps at 16 requests, other rounds 0.9-4.9 ms: README, "On a CPU without
# AVX-512"), where a price nothing measures only fades.
BRANCH_PRIOR_WEIGHT = 16.0
DECAY = 0.995  # per observed step: about two hundred steps of memory


class StepCost:
    """c(R, D, B) = fixed + per_request * R + per_draft * D + branch * B, a weighted least-squares fit over recent
    steps, each slope pulled toward a prior (per_request = per_draft = PRIOR_SLOPE * fixed as the first step
    suggests, branch = 0, worth BRANCH_PRIOR_WEIGHT branched steps) where the steps say little about it: a branch
    price that no recent step measured decays to 0, so trees are tried again and measured afresh.
    `relative_node_cost` fixes the costs instead (1 + relative_node_cost per request or draft, no branch price),
    for reproducible tree sizes; `frozen` fixes any coefficients (e.g. a run's fitted ones, read back from its
    stats)."""

    def __init__(self, relative_node_cost: float | None = None) -> None:
        s = relative_node_cost
        self._frozen: tuple[float, float, float, float] | None = None if s is None else (1.0, s, s, 0.0)
        self._xtx = np.zeros((4, 4))
        self._xty = np.zeros(4)
        self._prior: float | None = None  # the prior slope (seconds per token) once a first step was seen
        self._fit: tuple[float, float, float, float] | None = None  # solved once per observation

    def observe(self, requests: int, drafts: int, branched: bool, seconds: float) -> None:
        if self._frozen is not None or seconds <= 0 or requests <= 0:
            return
        if self._prior is None:
            self._prior = seconds / (1 + PRIOR_SLOPE * (requests + drafts)) * PRIOR_SLOPE
        x = np.array([1.0, requests, drafts, float(branched)])
        self._xtx = self._xtx * DECAY + np.outer(x, x)
        self._xty = self._xty * DECAY + x * seconds
        self._fit = None

    def coefficients(self) -> tuple[float, float, float, float]:
        """(fixed, per_request, per_draft, branch) in seconds (relative units before any step was timed)."""
        if self._frozen is not None:
            return self._frozen
        if self._prior is None:
            return 1.0, PRIOR_SLOPE, PRIOR_SLOPE, 0.0
        if self._fit is None:
            self._fit = self._solve(self._prior)
        return self._fit

    def _solve(self, s: float) -> tuple[float, float, float, float]:
        # The prior as pseudo-rows on the slopes alone (the intercept is always measured): w * (spread * (k - k0))^2.
        ridge = PRIOR_WEIGHT * PRIOR_SPREAD**2
        xtx = self._xtx + np.diag([0.0, ridge, ridge, BRANCH_PRIOR_WEIGHT])
        xty = self._xty + np.array([0.0, ridge * s, ridge * s, 0.0])
        a, r, d, b = np.linalg.solve(xtx, xty)  # positive definite: one step observed, and a ridge on each slope
        r, d, b = max(float(r), 0.0), max(float(d), 0.0), max(float(b), 0.0)
        return max(float(a), 1e-9), r, d, b

    @classmethod
    def frozen(cls, coefficients: Sequence[float]) -> StepCost:
        cost = cls()
        fixed, per_request, per_draft, branch = (float(c) for c in coefficients)
        cost._frozen = (fixed, per_request, per_draft, branch)
        return cost

    def seconds(self, requests: int, drafts: int, branched: bool = False) -> float:
        a, r, d, b = self.coefficients()
        return max(a + r * requests + d * drafts + (b if branched else 0.0), 1e-9)


def score_floor(cost: StepCost, requests: int) -> float:
    """The bar a node's score must clear before `choose_sizes` takes any node, in any plan of `plan_step`: the bar
    only rises as nodes are taken (a node raises it exactly when it clears it), so no node scoring at or below
    this is ever taken, and the sources need not draft such nodes at all (at a large batch on a CPU, most of
    them)."""
    return requests * cost.coefficients()[2] / cost.seconds(requests, 0, branched=True)


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
) -> Sizes:
    """Nodes (root included, >= 1) to keep of each tree (each ordered best first, `StepTree.by_score`).

    caps[i]: most nodes tree i may keep; requests: the step's decoding requests (lookahead's trees and others,
    each yields its x0's token); budget: most non-root nodes in all; branched: price the step with the branch
    cost from its first node on (the trees may branch).
    """
    per_draft = cost.coefficients()[2]
    seconds = cost.seconds(requests, 0, branched)
    sizes = [1] * len(trees)
    expected = float(requests)
    # (negated score, tree): always the best node not yet taken whose parent is taken (trees are ordered best
    # first, so each tree offers its next node).
    heap = [(-t.scores[1], i) for i, t in enumerate(trees) if t.num_nodes > 1 and caps[i] > 1]
    heapq.heapify(heap)
    added = 0
    while heap and added < budget:
        neg, i = heapq.heappop(heap)
        p = -neg
        if p * seconds <= expected * per_draft:
            break  # the best remaining node does not pay, so no other does
        sizes[i] += 1
        added += 1
        seconds += per_draft
        expected += p
        t = trees[i]
        if sizes[i] < min(t.num_nodes, caps[i]):
            heapq.heappush(heap, (-t.scores[sizes[i]], i))
    if not added:
        seconds = cost.seconds(requests, 0)  # plain decoding: no branch to pay for
    return Sizes(sizes, expected, seconds)


def plan_step(
    trees: Sequence[StepTree], caps: Sequence[int], requests: int, cost: StepCost, budget: int
) -> tuple[list[StepTree], list[int]]:
    """The step's trees and their sizes: each request's best chain alone (`StepTree.best_chain`), or the trees
    themselves where what their branches add is worth the branch price. Either way no better plan than plain
    decoding is passed over: a node is only taken when it pays."""
    if cost.coefficients()[3] <= 0:  # no branch price: the trees hold the chains and more
        return list(trees), choose_sizes(trees, caps, requests, cost, budget).sizes
    chains = [t.best_chain() for t in trees]
    by_chain = choose_sizes(chains, caps, requests, cost, budget)
    by_tree = choose_sizes(trees, caps, requests, cost, budget, branched=True)
    # A best-first prefix without a branch is the best chain's prefix: then the chains, priced without the branch.
    branches = any(not t.prefix_is_chain(k) for t, k in zip(trees, by_tree.sizes, strict=True))
    if branches and by_tree.rate > by_chain.rate:
        return list(trees), by_tree.sizes
    return chains, by_chain.sizes
