"""Timing the engine's decoding steps for the step-cost fit (`cost.StepCost`)."""

from __future__ import annotations

from dataclasses import dataclass

# An engine's first decoding steps pay first-use costs (allocations, kernels' first runs on new shapes) that later
# steps do not: they are left out of the fit (docs/results.md, "Tuned constants").
COLD_STEPS = 4


@dataclass
class _TimedStep:
    start: float
    requests: int
    drafts: int
    branched: bool = False
    end: float | None = None  # when its drafting ended


class StepTimer:
    """Times pure decoding steps for the step-cost fit: from one step's start, through its drafting, to the next step's
    start, so that the engine's own work between two steps (scheduling, output processing: 0.9 ms of a 25 ms step at
    batch 1 and 1.5-1.7 of 45-51 at 16 requests, bfloat16 ShareGPT on a 2-core CPU) is part of what a step costs. A gap
    longer than the step itself is the engine waiting for requests, not work, and is left out. The engine's first
    `cold` complete steps are not returned (COLD_STEPS). Keeps the timed steps' totals (`timed`, `span_seconds`,
    `gap_seconds`) for the worker's stats."""

    def __init__(self, cold: int = 0) -> None:
        self._open: _TimedStep | None = None
        self.cold = cold  # complete steps still to leave out
        self.timed = 0  # steps timed so far
        self.span_seconds = 0.0  # their summed spans, start to end of drafting
        self.gap_seconds = 0.0  # their summed gaps counted, end of drafting to the next step's start

    def begin(self, now: float, requests: int, drafts: int | None) -> tuple[int, int, bool, float] | None:
        """A step starts at `now`; drafts None: not a pure decoding step (not timed). Returns the step before, now
        complete, as `StepCost.observe` takes it (requests, drafts, branched, seconds), or None if it was not timed."""
        last, self._open = self._open, None
        if drafts is not None:
            self._open = _TimedStep(now, requests, drafts)
        if last is None or last.end is None:
            return None
        if self.cold > 0:
            self.cold -= 1
            return None
        span, gap = last.end - last.start, now - last.end
        gap = gap if 0 <= gap <= span else 0.0
        self.timed += 1
        self.span_seconds += span
        self.gap_seconds += gap
        return last.requests, last.drafts, last.branched, span + gap

    def branched(self, branched: bool) -> None:
        """Whether the step under way runs branched trees (the tree attention path)."""
        if self._open is not None:
            self._open.branched = branched

    def end(self, now: float) -> None:
        """The step's drafting ended: what remains until the next step starts is the engine's work between them."""
        if self._open is not None and self._open.end is None:
            self._open.end = now
