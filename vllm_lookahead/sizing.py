"""How many tree nodes each request's step carries: as many as raise the expected tokens per second.

A step that computes T tokens costs c(T) = fixed + per_token * T seconds (`StepCost`, fitted to the engine's own
step times, so it follows the machine, model, dtype and batch). Its requests yield R tokens for sure (one each)
plus, in expectation, the scores of their tree nodes (each node's probability of being accepted). Adding a node of
score p pays iff (Y + p) / c(T + 1) > Y / c(T), i.e. p > Y * per_token / c(T), where Y is the yield so far.
`choose_sizes` adds nodes across all requests in descending score while they pay: small trees where tokens are
dear (a CPU, a large batch), large ones where they are nearly free (a GPU), none where nothing is likely enough.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from vllm_lookahead.tree import StepTree

# Before any step was timed: a step over T tokens costs (1 + PRIOR_SLOPE * T) plain steps.
PRIOR_SLOPE = 0.03
PRIOR_WEIGHT = 8.0  # pseudo-steps behind the prior line
DECAY = 0.995  # per observed step: about two hundred steps of memory


class StepCost:
    """c(T) = fixed + per_token * T, a weighted least-squares line through (tokens, seconds) of recent steps,
    anchored by a prior line through the first step's time. `relative_node_cost` fixes the line instead
    (per_token / fixed), for reproducible tree sizes."""

    def __init__(self, relative_node_cost: float | None = None) -> None:
        self.fixed_slope = relative_node_cost
        self._sw = self._st = self._stt = self._sy = self._sty = 0.0
        self._prior: tuple[float, float] | None = None  # (fixed, per_token) once a first step was seen

    def observe(self, tokens: int, seconds: float) -> None:
        if self.fixed_slope is not None or seconds <= 0:
            return
        if self._prior is None:
            fixed = seconds / (1 + PRIOR_SLOPE * tokens)
            self._prior = (fixed, fixed * PRIOR_SLOPE)
        d = DECAY
        self._sw, self._st, self._stt = self._sw * d + 1, self._st * d + tokens, self._stt * d + tokens * tokens
        self._sy, self._sty = self._sy * d + seconds, self._sty * d + tokens * seconds

    def line(self) -> tuple[float, float]:
        """(fixed, per_token) in seconds (relative units before any step was timed)."""
        if self.fixed_slope is not None:
            return 1.0, self.fixed_slope
        if self._prior is None:
            return 1.0, PRIOR_SLOPE
        a0, b0 = self._prior
        # Prior pseudo-observations: PRIOR_WEIGHT steps at each of T=1 and T=64 on the prior line.
        w = PRIOR_WEIGHT / 2
        sw = self._sw + 2 * w
        st = self._st + w * (1 + 64)
        stt = self._stt + w * (1 + 64 * 64)
        sy = self._sy + w * (a0 + b0 + a0 + 64 * b0)
        sty = self._sty + w * (a0 + b0 + 64 * (a0 + 64 * b0))
        den = sw * stt - st * st
        b = (sw * sty - st * sy) / den if den > 0 else b0
        b = max(b, 0.0)
        a = max((sy - b * st) / sw, 1e-9)
        return a, b


def score_floor(cost: StepCost, num_trees: int, other_tokens: int) -> float:
    """The bar a node's score must clear before `choose_sizes` takes any node: the bar only rises as nodes are
    taken (a node raises it exactly when it clears it), so no node scoring at or below this is ever taken, and
    the sources need not draft such nodes at all (at a large batch on a CPU, most of them)."""
    fixed, per_token = cost.line()
    return num_trees * per_token / (fixed + per_token * other_tokens)


def choose_sizes(
    trees: Sequence[StepTree], caps: Sequence[int], other_tokens: int, cost: StepCost, budget: int
) -> list[int]:
    """Nodes (root included, >= 1) to keep of each tree (each ordered best first, `StepTree.by_score`).

    caps[i]: most nodes tree i may keep; other_tokens: what the step computes besides the trees' nodes (their
    roots count there too; e.g. other requests' tokens); budget: most non-root nodes in all.
    """
    fixed, per_token = cost.line()
    sizes = [1] * len(trees)
    total_tokens = other_tokens
    expected = float(len(trees))  # every tree yields its root's token
    # (negated score, tree, node): always the best node not yet taken whose parent is taken (trees are ordered
    # best first, so each tree offers its next node).
    heap = [(-t.scores[1], i) for i, t in enumerate(trees) if t.num_nodes > 1 and caps[i] > 1]
    heapq.heapify(heap)
    added = 0
    while heap and added < budget:
        neg, i = heapq.heappop(heap)
        p = -neg
        if p * (fixed + per_token * total_tokens) <= expected * per_token:
            break  # the best remaining node does not pay, so no other does
        sizes[i] += 1
        added += 1
        total_tokens += 1
        expected += p
        t = trees[i]
        if sizes[i] < min(t.num_nodes, caps[i]):
            heapq.heappush(heap, (-t.scores[sizes[i]], i))
    return sizes
