"""What a decoding step costs against the tokens it computes, learned from the engine's own steps whatever the
curve's shape (`StepCost`).

A step of R decoding requests and D draft tokens computes T = R + D tokens. Its price is a curve in T for each
request count, monotone but neither convex nor concave by assumption:

    price(R, T) = seed(T) + excess(R, T)

- `seed(T)`: forward passes the engine timed at start-up (`StepCost.seed`: T = 1, 2, 4, ... up to the largest tree,
  in the engine's dtype, cache layout and graph mode), past the last one along its last slope. Before a seed: a line,
  1 + PRIOR_SLOPE per token, in units of the first step timed.
- `excess(R, T)`: what the timed steps cost beyond the seed (the engine's scheduling and sampling, the plugin, longer
  contexts, more requests): per cell of (band of R, grid point of T, whether a tree branched), the median of the
  cell's recent steps; between measured cells it is interpolated along T, past them held flat; where no step was
  measured it is never below 0, so a size nobody measured is priced from the seed, never below it. A branched step
  where no branched step was measured is priced as an unbranched one; a band with nothing measured borrows the
  nearest measured band's excess.
The prices along T are then made non-decreasing (isotonic regression, weighted by the steps behind each cell) and
rise at least MIN_SLOPE_SHARE of the seed's slope, so that every token costs something (`PriceCurve`).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

# Before any seed: a step costs 1 + PRIOR_SLOPE per token it computes, in units of the first step timed.
PRIOR_SLOPE = 0.1
# Tokens a step computes at which prices are kept (the curve is linear between them).
GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768,
        1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 65536)  # fmt: skip
# Upper edges of the bands of request counts that share a curve.
BANDS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096, 1 << 30)
CELL_STEPS = 16  # the recent steps a cell keeps; its price is their median
MIN_STEPS = 3  # steps a cell needs before its median counts as measured
MEMORY = 1024  # steps after which a cell's step is forgotten (the size is then priced from its neighbours again)
MIN_SLOPE_SHARE = 0.25  # the least a token costs, as a share of the seed's slope there
SEED_FLOOR_SLOPE = 1e-4  # the least a token costs in the seed, as a share of its one-token step
UNMEASURED_WEIGHT = 0.25  # weight of an unmeasured grid point in the isotonic regression (a measured one: its steps)
REBUILD_EVERY = 4  # once a curve rests on this many measured cells, it is rebuilt at most every so many steps
TABLE_TOKENS = 256  # the least a curve's table of prices by whole token counts holds


@dataclass(frozen=True)
class PriceCurve:
    """Seconds of a step against the tokens it computes, for one band of request counts: linear between the grid
    points, non-decreasing, along the last slope past the grid."""

    tokens: np.ndarray  # grid points, ascending (float)
    seconds: np.ndarray  # the price at each, non-decreasing
    least_slope: np.ndarray  # [k]: the least slope of the segments from grid point k on (the last: the last slope)
    _table: list[np.ndarray] = field(default_factory=list, compare=False, repr=False)  # prices at 0, 1, 2, ... tokens

    def span(self, first: int, n: int) -> np.ndarray:
        """Prices at first, first + 1, ..., first + n - 1 tokens (from a table of whole token counts, made once: the
        sizing asks every step)."""
        end = first + n
        if not self._table or len(self._table[0]) < end:
            self._table[:] = [self.prices(np.arange(max(2 * end, TABLE_TOKENS), dtype=float))]
        return self._table[0][first:end]

    def at(self, tokens: float) -> float:
        t, s = self.tokens, self.seconds
        if tokens > t[-1]:
            return float(s[-1] + (tokens - t[-1]) * self.least_slope[-1])
        return float(np.interp(tokens, t, s))

    def prices(self, tokens: np.ndarray) -> np.ndarray:
        t, s = self.tokens, self.seconds
        out = np.interp(tokens, t, s)
        past = tokens > t[-1]
        if past.any():
            out[past] = s[-1] + (tokens[past] - t[-1]) * self.least_slope[-1]
        return out

    def least_marginal(self, tokens: float) -> float:
        """The least that one token more costs anywhere from `tokens` on: the bar below which no node ever pays."""
        k = min(max(bisect.bisect_right(self.tokens.tolist(), tokens) - 1, 0), len(self.tokens) - 1)
        return float(self.least_slope[k])


def _non_decreasing(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence nearest to y in squares weighted by w (pool adjacent violators)."""
    vals: list[float] = []
    wts: list[float] = []
    lens: list[int] = []
    for yi, wi in zip(y.tolist(), w.tolist(), strict=True):
        vals.append(yi)
        wts.append(wi)
        lens.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            v2, w2, n2 = vals.pop(), wts.pop(), lens.pop()
            v1, w1, n1 = vals.pop(), wts.pop(), lens.pop()
            vals.append((v1 * w1 + v2 * w2) / (w1 + w2))
            wts.append(w1 + w2)
            lens.append(n1 + n2)
    return np.repeat(vals, lens)


def _curve(tokens: np.ndarray, seconds: np.ndarray, least: np.ndarray) -> PriceCurve:
    """A PriceCurve through (tokens, seconds) whose segment k rises at least least[k] per token: each point at least
    any point left of it plus the least rises between them."""
    gaps = np.diff(tokens)
    rise = np.concatenate(([0.0], np.cumsum(least * gaps)))
    out = rise + np.maximum.accumulate(seconds - rise)
    slopes = np.diff(out) / gaps
    tail = np.minimum.accumulate(slopes[::-1])[::-1]
    return PriceCurve(tokens, out, np.append(tail, slopes[-1]))


class _Cell:
    """A grid point's recent steps of one band, (step number, seconds, tokens computed), and the median of what they
    cost beyond the seed (computed again when a step comes, goes, or the seed changes)."""

    __slots__ = ("steps", "median", "seed_version")

    def __init__(self) -> None:
        self.steps: deque[tuple[int, float, int]] = deque(maxlen=CELL_STEPS)
        self.median: float | None = None
        self.seed_version = -1

    def add(self, step: int, seconds: float, tokens: int) -> None:
        self.steps.append((step, seconds, tokens))
        self.median = None

    def measured(self, oldest: int, seed_at: Callable[[float], float], seed_version: int) -> float | None:
        """The median excess over the seed of the steps since `oldest`, if there are MIN_STEPS of them."""
        steps = self.steps
        while steps and steps[0][0] < oldest:
            steps.popleft()
            self.median = None
        if len(steps) < MIN_STEPS:
            return None
        if self.median is None or self.seed_version != seed_version:
            ordered = sorted(sec - seed_at(t) for _, sec, t in steps)
            mid = len(ordered) // 2
            self.median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
            self.seed_version = seed_version
        return self.median


class StepCost:
    """The step's price (`PriceCurve` per band of request counts and per branched or not), from the start-up seed
    and the engine's timed steps (module docstring). `relative_node_cost` fixes the curve instead (a step costs
    1 + relative_node_cost per token it computes, nothing learned): reproducible tree sizes. `max_tokens`: the most
    tokens a step can compute (the grid stops there)."""

    def __init__(self, relative_node_cost: float | None = None, max_tokens: int = 8192) -> None:
        top = max(int(max_tokens), 2)
        self._grid = np.array(sorted({g for g in GRID if g < top} | {top}), dtype=float)
        self._grid_list = self._grid.tolist()
        self._frozen = False
        self._seed: np.ndarray | None = None  # the seed's price at each grid point
        self._seed_kind = "none"  # none, relative (the prior, before any step), prior (in seconds), seed, fixed
        self.seed_points: tuple[tuple[int, ...], tuple[float, ...]] = ((), ())  # the start-up timings given
        self._cells: dict[tuple[int, bool], dict[int, _Cell]] = {}  # (band, branched) -> grid point -> its cell
        self._steps = 0  # steps observed
        self._version = 0  # bumped by each observation or seed
        self._seed_version = 0  # bumped by each seed
        self._least = np.zeros(len(self._grid) - 1)  # the least a token costs along the grid
        self._curves: dict[tuple[int, bool], tuple[int, int, bool, PriceCurve]] = {}
        self._known: dict[tuple[int, bool], tuple[int, tuple | None]] = {}  # `_measured`, as of a version
        if relative_node_cost is not None:
            self._set_seed([1.0, 2.0], [1.0 + relative_node_cost, 1.0 + 2 * relative_node_cost], "fixed")
            self._frozen = True

    @classmethod
    def fixed(cls, tokens: Sequence[float], seconds: Sequence[float], max_tokens: int = 8192) -> StepCost:
        """A curve that learns nothing: a step of any batch costs `seconds` at `tokens` (linear between, along the
        last slope past them)."""
        cost = cls(max_tokens=max_tokens)
        cost._set_seed(tokens, seconds, "fixed")
        cost._frozen = True
        return cost

    # -- what it learns from ---------------------------------------------------------------------------------------
    def seed(self, tokens: Sequence[int], seconds: Sequence[float]) -> None:
        """Start-up timings: a forward pass of one request computing tokens[i] tokens took seconds[i]."""
        if self._frozen:
            return
        pairs = sorted((int(t), float(s)) for t, s in zip(tokens, seconds, strict=True) if t >= 1 and s > 0)
        if not pairs:
            return
        self.seed_points = (tuple(t for t, _ in pairs), tuple(s for _, s in pairs))
        # A busy machine only adds time, and a pass of more tokens never costs less: no size costs more than any
        # larger size was timed at.
        seconds = np.minimum.accumulate(np.array([s for _, s in pairs])[::-1])[::-1]
        self._set_seed([t for t, _ in pairs], seconds, "seed")

    def _set_seed(self, tokens: Sequence[float], seconds: Sequence[float], kind: str) -> None:
        t, first = np.unique(np.asarray(tokens, dtype=float), return_index=True)
        s = _non_decreasing(np.asarray(seconds, dtype=float)[first], np.ones(len(t)))
        if len(t) == 1:  # one point: the prior's slope from it
            t, s = np.array([t[0], t[0] + 1.0]), np.array([s[0], s[0] * (1 + PRIOR_SLOPE)])
        floor = 0.0 if kind == "fixed" else SEED_FLOOR_SLOPE * s[0]
        self._seed = _curve(t, s, np.full(len(t) - 1, floor)).prices(self._grid)
        # the least a token costs: a share of the seed's slope where the seed was measured, else next to nothing
        slope = np.maximum(np.diff(self._seed) / np.diff(self._grid), 0.0)
        self._least = (MIN_SLOPE_SHARE if kind == "seed" else 0.0) * slope
        self._seed_kind = kind
        self._seed_version += 1
        self._version += 1

    @property
    def seeded(self) -> bool:
        """Whether the prices rest on start-up timings (or are fixed)."""
        return self._seed_kind in ("seed", "fixed")

    def observe(self, requests: int, drafts: int, branched: bool, seconds: float) -> None:
        """A timed decoding step: `requests` requests, `drafts` draft tokens, whether a tree branched, its seconds."""
        if self._frozen or seconds <= 0 or requests <= 0:
            return
        t = requests + drafts
        if self._seed_kind in ("none", "relative", "prior"):
            # no start-up seed: the prior line, in units of the cheapest step so far (one that took longer than
            # steps its size do, such as a branched step where branching is dear, would misscale every price)
            one = seconds / (1 + PRIOR_SLOPE * (t - 1))
            if self._seed_kind != "prior" or one < self._seed[0]:
                self._set_seed([1.0, 2.0], [one, one * (1 + PRIOR_SLOPE)], "prior")
        key = (_band(requests), bool(branched))
        cells = self._cells.setdefault(key, {})
        g = self._nearest(t)
        cell = cells.get(g)
        if cell is None:
            cell = cells[g] = _Cell()
        cell.add(self._steps, seconds, t)
        self._steps += 1
        self._version += 1

    def _nearest(self, tokens: int) -> int:
        """The grid point nearest to `tokens` in ratio."""
        grid = self._grid_list
        k = bisect.bisect_left(grid, tokens)
        if k >= len(grid):
            return len(grid) - 1
        if k > 0 and tokens * tokens < grid[k - 1] * grid[k]:
            return k - 1
        return k

    def _seed_at(self, tokens: float) -> float:
        g, s = self._grid, self._seed
        if tokens > g[-1]:
            return float(s[-1] + (tokens - g[-1]) * (s[-1] - s[-2]) / (g[-1] - g[-2]))
        return float(np.interp(tokens, g, s))

    # -- prices --------------------------------------------------------------------------------------------------
    def curve(self, requests: int, branched: bool = False) -> PriceCurve:
        """The price of a step of `requests` decoding requests against the tokens it computes."""
        if self._seed is None:  # nothing timed yet: the prior line in units of a one-token step
            self._set_seed([1.0, 2.0], [1.0, 1.0 + PRIOR_SLOPE], "relative")
        key = (_band(requests), bool(branched))
        cached = self._curves.get(key)
        if cached is not None:
            version, built, settled, curve = cached
            if version == self._version or (settled and self._steps - built < REBUILD_EVERY):
                return curve
        if key[1] and (self._frozen or self._measured(key) is None):
            curve, settled = self.curve(requests), False  # no branched step measured: priced as unbranched
        else:
            curve, settled = self._build(key)
        self._curves[key] = (self._version, self._steps, settled, curve)
        return curve

    def _measured(self, key: tuple[int, bool]) -> tuple[list[int], list[float], list[int]] | None:
        """(grid indices, median excess, steps) of the key's measured cells; None if none is measured."""
        cells = self._cells.get(key)
        if cells is None:
            return None
        known = self._known.get(key)
        if known is not None and known[0] == self._version:
            return known[1]
        oldest = self._steps - MEMORY
        idx, med, steps = [], [], []
        for g in sorted(cells):
            m = cells[g].measured(oldest, self._seed_at, self._seed_version)
            if m is not None:
                idx.append(g)
                med.append(m)
                steps.append(len(cells[g].steps))
        out = (idx, med, steps) if idx else None
        self._known[key] = (self._version, out)
        return out

    def _build(self, key: tuple[int, bool]) -> tuple[PriceCurve, bool]:
        seed, grid = self._seed, self._grid
        excess = np.zeros_like(grid)
        weight = np.full_like(grid, UNMEASURED_WEIGHT)
        measured = None if self._frozen else self._measured(key)
        if measured is not None:
            idx, med, steps = measured
            excess = np.maximum(np.interp(grid, grid[idx], med), 0.0)  # unmeasured: never below the seed
            excess[idx] = med
            weight[idx] = steps
        elif not self._frozen:
            borrowed = self._borrowed(*key)
            if borrowed is not None:
                excess = np.maximum(borrowed, 0.0)
        prices = _non_decreasing(seed + excess, weight)
        return _curve(grid, prices, self._least), measured is not None and len(measured[0]) >= 2

    def _borrowed(self, band: int, branched: bool) -> np.ndarray | None:
        """The excess along the grid of the nearest measured curve: the same band's other kind of step, then the
        nearest band's (the band below first, unbranched first)."""
        keys = [(band, not branched)]
        for d in range(1, len(BANDS)):
            keys += [(band - d, False), (band - d, True), (band + d, False), (band + d, True)]
        for key in keys:
            measured = self._measured(key)
            if measured is not None:
                idx, med, _ = measured
                return np.interp(self._grid, self._grid[idx], med)
        return None

    def seconds(self, requests: int, drafts: int, branched: bool = False) -> float:
        return self.curve(requests, branched).at(requests + drafts)

    def summary(self, requests: int = 1) -> dict[str, float]:
        """For the worker's stats: a step's price at a few sizes (seconds; relative units if fixed or untimed), a
        branched one's at 8 tokens, and the start-up seed's points (how many; their prices at the same sizes)."""
        curve = self.curve(requests)
        out = {f"step_cost_t{t}": curve.at(t) for t in SUMMARY_TOKENS}
        out["step_cost_branched_t8"] = self.curve(requests, True).at(8)
        out["step_cost_seed_points"] = float(len(self.seed_points[0]))
        if self._seed_kind == "seed":
            out |= {f"step_cost_seed_t{t}": self._seed_at(t) for t in SUMMARY_TOKENS}
        return out


SUMMARY_TOKENS = (1, 2, 4, 8, 16, 32, 64)


def _band(requests: int) -> int:
    return bisect.bisect_left(BANDS, requests)
