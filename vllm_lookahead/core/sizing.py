"""How many tree nodes each request's step carries: the plan with the most expected tokens per second.

A step's requests yield R tokens for sure plus, in expectation, the worth of their draft nodes (each node's chance of
being accepted: its score times its request's `AcceptanceStats.calibration`, `scales`). For each total D of draft
nodes the best plan takes the D worthiest nodes across all requests (a child never outscores its parent, so they form
trees); it is expected to yield E(D) = R + their worth and costs the step's price at T = R + D tokens
(`cost.StepCost`, a curve of any shape). `choose_sizes` takes the D with the highest E(D) / price, over every total it
could carry, if it beats plain decoding by MARGIN: small trees where tokens are dear (a CPU, a large batch), large ones
where they are nearly free (a GPU, AMX), none where nothing is likely enough, and on a concave curve (the first draft
tokens the dearest) either none or enough to pay for them. `plan_step` weighs the trees against each request's best
chain alone, which runs without the tree attention path's price where it has one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vllm_lookahead.core.cost import StepCost
from vllm_lookahead.core.tree import StepTree

# A plan with drafts must beat plain decoding's expected rate by this share: worth is estimated, and where a plan's
# gain is smaller than that estimate's error it loses as often as it wins (docs/results.md, "Tuned constants").
MARGIN = 0.02


def score_floor(cost: StepCost, requests: int) -> float:
    """A score at or below which no node is in any plan `plan_step` chooses, so the sources need not draft such
    nodes at all (at a large batch on a CPU, most of them). The best plan's rate r is at least plain decoding's,
    R / c(R), and its last node, of score p, must not lower it: p >= r * (what that node costs) >= R / c(R) * the
    least a token costs from T = R on."""
    plain = cost.curve(requests)
    least = min(plain.least_marginal(requests), cost.curve(requests, True).least_marginal(requests))
    return requests * least / plain.at(requests)


@dataclass
class Sizes:
    sizes: list[int]  # nodes (root included, >= 1) to keep of each tree
    expected: float  # tokens the step is expected to yield
    seconds: float  # what it is expected to cost

    @property
    def rate(self) -> float:
        return self.expected / self.seconds


def choose_sizes(
    scores: Sequence[Sequence[float]],
    caps: Sequence[int],
    requests: int,
    cost: StepCost,
    budget: int,
    branched: bool = False,
    scales: Sequence[float] | None = None,
) -> Sizes:
    """Nodes (root included, >= 1) to keep of each tree, given by its nodes' scores best first, the root's first
    (`StepTree.scores` of a tree in `StepTree.by_score` order, or `StepTree.best_chain_scores`).

    caps[i]: most nodes tree i may keep; requests: the step's decoding requests (lookahead's trees and others,
    each yields its x0's token); budget: most non-root nodes in all; branched: price the step as one whose trees
    may branch; scales[i]: what tree i's scores are worth (its request's calibration; default 1).
    """
    plain = cost.seconds(requests, 0)  # no drafts: nothing branches
    sizes = [1] * len(scores)
    flat: list[float] = []
    lengths: list[int] = []
    for sc, cap in zip(scores, caps, strict=True):
        n = max(min(len(sc), cap) - 1, 0)
        flat.extend(sc[1 : n + 1])
        lengths.append(n)
    if not flat or budget <= 0:
        return Sizes(sizes, float(requests), plain)
    values = np.asarray(flat, dtype=float)
    if scales is not None:
        values *= np.repeat(np.asarray(scales, dtype=float), lengths)
    # The nodes in descending worth, ties in their order (a tree's own order first: parents before children); one
    # tree is in that order already.
    several = sum(1 for n in lengths if n) > 1
    order = np.argsort(-values, kind="stable")[:budget] if several else np.arange(min(len(values), budget))
    expected = requests + np.cumsum(values[order])
    seconds = cost.curve(requests, branched).span(requests + 1, len(order))
    rates = expected / seconds
    best = int(np.argmax(rates))
    if not rates[best] > requests / plain * (1 + MARGIN):
        return Sizes(sizes, float(requests), plain)
    if several:
        counts = np.bincount(np.repeat(np.arange(len(scores)), lengths)[order[: best + 1]], minlength=len(scores))
        sizes = (counts + 1).tolist()
    else:
        sizes[next(i for i, n in enumerate(lengths) if n)] += best + 1
    return Sizes(sizes, float(expected[best]), float(seconds[best]))


def plan_step(
    trees: Sequence[StepTree],
    caps: Sequence[int],
    requests: int,
    cost: StepCost,
    budget: int,
    scales: Sequence[float] | None = None,
) -> tuple[list[StepTree], list[int]]:
    """The step's trees and their sizes: the trees themselves, priced as a step whose trees branch, or each request's
    best chain alone (`StepTree.best_chain`), priced as one without, whichever is expected to yield more per second.
    Either way no better plan than plain decoding is passed over."""
    by_tree = choose_sizes([t.scores for t in trees], caps, requests, cost, budget, branched=True, scales=scales)
    branches = any(not t.prefix_is_chain(k) for t, k in zip(trees, by_tree.sizes, strict=True))
    if branches and cost.curve(requests, True) is cost.curve(requests):
        return list(trees), by_tree.sizes  # branching costs nothing more: the trees hold the chains and more
    # A best-first prefix without a branch is the best chain's prefix: then the chains, priced without the branch
    # (the chains themselves are made only if they are the plan).
    by_chain = choose_sizes([t.best_chain_scores() for t in trees], caps, requests, cost, budget, scales=scales)
    if branches and by_tree.rate > by_chain.rate:
        return list(trees), by_tree.sizes
    return [t.best_chain() for t in trees], by_chain.sizes
