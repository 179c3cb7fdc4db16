"""What a decoding step costs, fitted to the engine's own steps (`StepCost`), so that it follows the machine, model,
dtype and batch.

A decoding step with R requests and D draft tokens computes T = R + D tokens and costs
c = fixed + per_request * R + per_draft_below * min(T, knee) + per_draft * max(0, T - knee) + branch * B seconds,
where B is 1 when a scheduled tree branches. Up to the knee a step is bound by reading the weights, and a token more
costs little (per_draft_below); past it by arithmetic, and each token costs per_draft. On a 2-core CPU at batch 1 a
step of 1-6 tokens costs about the same and each token beyond costs about 1.3 ms; on a GPU, where a forward over many
tokens costs little more than over one, the knee lies far out. B is the tree attention path's own price where it has
one: on a CPU in the amx layout a branched tree runs the tree kernel beside vLLM's kernel on the other rows, layer
by layer, where a chain of drafts runs vLLM's kernel alone (in the vec layout the tree kernel takes every small
request's rows, and the fit finds no price). The cost is convex in D (per_draft >= per_draft_below), which the
sizing relies on.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

# Before any step was timed, relative units: a step costs 1 + PRIOR_SLOPE per token it computes.
PRIOR_SLOPE = 0.03
# Weight of the prior on each slope, in steps: enough to keep the first estimates sane, little enough that a few
# hundred steps override it wherever the batch varies what the slope multiplies.
PRIOR_WEIGHT = 2.0
# Where the prior on a slope sits: as if PRIOR_WEIGHT steps had differed by this many requests or drafts.
PRIOR_SPREAD = 8.0
# Weight of the branch price's prior (0), in branched steps. At a large batch trees seldom branch, so a handful of
# branched steps is all the fit sees of the price, and one of them slowed by the machine priced branching out of the
# rest of a run (48.9 ms from 5 branched steps at 16 requests, other rounds 0.9-4.9 ms, on an AVX2
# host), where a price nothing measures only fades.
BRANCH_PRIOR_WEIGHT = 16.0
DECAY = 0.995  # per observed step: about two hundred steps of memory
# Once the fit has this many steps' weight, it is solved again every RESOLVE_EVERY steps rather than every step (a
# solve is about 0.25 ms in the engine: every 4 steps it was 0.5% of a 15 ms step at 4 requests on a CPU; sixteen
# steps move a fit of two hundred steps' memory by little).
SETTLED = 64.0
RESOLVE_EVERY = 16
# The knees tried (tokens a step computes): each has its own fit, and the one that fits the recent steps best is used.
# A knee of 1 is the straight line (every token at per_draft).
KNEES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256, 384, 512)
# A knee is tried only where at least this share of the recent steps' weight lies on each side of it; otherwise the
# slope on its thin side is a few steps' noise, extrapolated. At 64 requests on a CPU nearly every step mixes in a
# prompt and is not timed, so the sizing there runs on what the fit learned before: a knee at 96 tokens fitted at 16
# requests (0.77 ms a token past it, 0.43 below) cut the drafts at 64 requests to a third (3.2 tokens a forward
# against 8.4 in the round before, bfloat16 random text, 0.94x suffix's tokens/s against 1.07x), where the steps
# traced on the same server lie on a line (0.45-0.52 ms a token); in that trace the knee jumped to 384 on four steps
# past it. The thin side is measured once the sizing crosses the knee.
KNEE_SUPPORT = 0.2


def knees() -> tuple[int, ...]:
    """KNEES, or the straight line alone with VLLM_LOOKAHEAD_COST_KNEE=0 (the knee's before/after in a benchmark)."""
    return (1,) if os.environ.get("VLLM_LOOKAHEAD_COST_KNEE", "1") == "0" else KNEES


class CostModel(NamedTuple):
    """c = fixed + per_request * R + per_draft_below * min(T, knee) + per_draft * max(0, T - knee) + branch * B."""

    fixed: float
    per_request: float
    per_draft: float  # a token's price past the knee
    branch: float
    knee: int = 1
    per_draft_below: float = 0.0  # a token's price up to the knee

    def seconds(self, requests: int, drafts: int, branched: bool = False) -> float:
        t = requests + drafts
        k = self.knee
        below = min(t, k) * self.per_draft_below + max(0, t - k) * self.per_draft
        return max(self.fixed + self.per_request * requests + below + (self.branch if branched else 0.0), 1e-9)

    def marginal(self, requests: int, drafts: int) -> float:
        """What one draft token more costs a step that computes requests + drafts tokens."""
        return self.per_draft_below if requests + drafts < self.knee else self.per_draft


class StepCost:
    """The step's cost (`CostModel`) as a weighted least-squares fit over recent steps, one per knee of KNEES, of
    which the one the Bayesian information criterion prefers among the convex ones (per_draft >= per_draft_below)
    with a fair share of the steps on each side (KNEE_SUPPORT) is used: a knee must fit the steps better than the
    straight line by more than its two parameters' worth.
    Each slope is pulled toward a prior (per_draft = per_draft_below = PRIOR_SLOPE * fixed as the first step
    suggests, per_request = 0, branch = 0 worth BRANCH_PRIOR_WEIGHT branched steps) where the steps say little about
    it: a branch price that no recent step measured decays to 0, so trees are tried again and measured afresh.
    `relative_node_cost` fixes the costs instead (1 + relative_node_cost per request or draft, no knee, no branch
    price), for reproducible tree sizes; `frozen` fixes any coefficients (e.g. a run's fitted ones, read back from
    its stats)."""

    def __init__(self, relative_node_cost: float | None = None) -> None:
        s = relative_node_cost
        self._frozen: CostModel | None = None if s is None else CostModel(1.0, 0.0, s, 0.0, 1, s)
        self._knee_list = knees()
        n = len(self._knee_list)
        self._knees = np.array(self._knee_list, dtype=float)
        self._xtx = np.zeros((n, 5, 5))
        self._xty = np.zeros((n, 5))
        self._yy = 0.0
        self._n = 0.0  # the steps' summed (decayed) weights
        self._beyond = np.zeros(n)  # per knee, the (decayed) weight of the steps that computed more tokens than it
        self._prior: float | None = None  # the prior slope (seconds per token) once a first step was seen
        self._fit: CostModel | None = None  # the last solution
        self._stale = 0  # observations since it was solved
        self._pending: list[tuple[int, int, bool, float]] = []  # observed, not yet in the sums (`_fold`)

    def observe(self, requests: int, drafts: int, branched: bool, seconds: float) -> None:
        if self._frozen is not None or seconds <= 0 or requests <= 0:
            return
        t = requests + drafts
        if self._prior is None:
            self._prior = seconds / (1 + PRIOR_SLOPE * t) * PRIOR_SLOPE
        # Into the sums when the fit is next solved (`_fold`): one vectorized update every RESOLVE_EVERY steps costs
        # a third of what a dozen small numpy calls a step did (0.06 ms a step in the engine, where caches are cold).
        self._pending.append((requests, t, branched, seconds))
        self._n = self._n * DECAY + 1.0
        self._stale += 1

    def _fold(self) -> None:
        """The pending steps into the decayed sums, each weighted as if it had been added when observed."""
        if not self._pending:
            return
        rows = np.array(self._pending, dtype=float)  # requests, tokens, branched, seconds
        self._pending.clear()
        m, k = len(rows), self._knees
        w = DECAY ** np.arange(m - 1, -1, -1)  # the older a step, the more decays it has seen since
        r, t, b, y = rows.T
        x = np.empty((len(k), 5, m))  # per knee, the steps' regressors as columns
        x[:, 0] = 1.0
        x[:, 1] = r
        x[:, 2] = np.minimum(t, k[:, None])
        x[:, 3] = np.maximum(0.0, t - k[:, None])
        x[:, 4] = b
        keep = DECAY**m
        self._xtx = self._xtx * keep + (x * w) @ x.transpose(0, 2, 1)
        self._xty = self._xty * keep + x @ (w * y)
        self._yy = self._yy * keep + float(w @ (y * y))
        self._beyond = self._beyond * keep + (t > k[:, None]) @ w

    def coefficients(self) -> CostModel:
        """The cost model in seconds (relative units before any step was timed)."""
        if self._frozen is not None:
            return self._frozen
        if self._prior is None:
            return CostModel(1.0, 0.0, PRIOR_SLOPE, 0.0, 1, PRIOR_SLOPE)
        if self._fit is None or self._stale >= (1 if self._n < SETTLED else RESOLVE_EVERY):
            self._fit = self._solve(self._prior)
            self._stale = 0
        return self._fit

    def _solve(self, s: float) -> CostModel:
        self._fold()
        # The prior as pseudo-rows on the slopes alone (the intercept is always measured): w * (spread * (k - k0))^2.
        ridge = PRIOR_WEIGHT * PRIOR_SPREAD**2
        reg = np.diag([0.0, ridge, ridge, ridge, BRANCH_PRIOR_WEIGHT])
        prior = np.array([0.0, 0.0, ridge * s, ridge * s, 0.0])
        # positive definite: one step observed, and a ridge on each slope
        a, v = self._xtx + reg, self._xty + prior
        beta = np.linalg.solve(a, v[:, :, None])[:, :, 0]
        # A request costs at least a draft token: its own token is one more row, and it adds its own bookkeeping.
        # Where drafts vary little (a large batch that seldom drafts), the free fit splits a row's price between the
        # two slopes at random: at 64 bfloat16 code requests on a 2-core CPU, a draft at 1.13-1.29 ms and a request
        # at -0.09 to -0.22 ms, where a step costs about 1.2 ms a row, drafts or not, and the sizing drafted in half
        # as many request-steps. There the knee is fitted again without the request's slope (so it is never < 0).
        low = np.flatnonzero(beta[:, 1] < 0)
        if low.size:
            k = np.array([0, 2, 3, 4])
            beta[low] = 0.0
            beta[low[:, None], k] = np.linalg.solve(a[low][:, k][:, :, k], v[low][:, k, None])[:, :, 0]
        # each knee's weighted squared error over the steps (the prior's pseudo-rows left out)
        sse = self._yy - 2 * np.einsum("ki,ki->k", beta, self._xty) + np.einsum("ki,kij,kj->k", beta, self._xtx, beta)
        # A knee must earn its two more parameters (where it lies, the slope below it), as the Bayesian information
        # criterion prices them: where the steps show no knee (at 16 requests every step is past any knee there is)
        # the straight line stands, rather than a knee that fits the noise and misprices the tokens on its far side.
        n = max(self._n, 1.0)
        score = n * np.log(np.maximum(sse, 1e-12 * n) / n) + np.where(self._knees > 1, 2 * np.log(n + 1), 0.0)
        # below the knee a token may cost less than past it, not more (a concave cost would end the search early),
        # and both its slopes are measured: each side holds a fair share of the steps (KNEE_SUPPORT)
        convex = beta[:, 3] >= beta[:, 2]
        side = KNEE_SUPPORT * self._n
        supported = (self._beyond >= side) & (self._n - self._beyond >= side)
        eligible = convex & supported
        eligible[0] = True  # knee 1, the line: every token is past it (its per_draft_below multiplies a constant)
        best = int(np.argmin(np.where(eligible, score, np.inf)))
        a, r, below, above, b = (float(v) for v in beta[best])
        above, b = max(above, 0.0), max(b, 0.0)
        if best == 0:  # knee 1: min(T, 1) = 1 is part of the intercept; the line's one slope serves both sides
            a, below = a + below - above, above
        else:
            below = min(max(below, 0.0), above)
        return CostModel(max(a, 1e-9), r, above, b, self._knee_list[best], below)

    @classmethod
    def frozen(cls, coefficients: Sequence[float]) -> StepCost:
        """Fixed coefficients, in CostModel's order."""
        cost = cls()
        c = [float(v) for v in coefficients]
        cost._frozen = CostModel(c[0], c[1], c[2], c[3], int(c[4]), c[5])
        return cost

    def seconds(self, requests: int, drafts: int, branched: bool = False) -> float:
        return self.coefficients().seconds(requests, drafts, branched)

    def marginal(self, requests: int, drafts: int) -> float:
        return self.coefficients().marginal(requests, drafts)
