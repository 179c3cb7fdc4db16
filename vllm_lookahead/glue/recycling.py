"""When token recycling is taught: the target's top tokens along every verified path cost a top-k per tree row, paid
only while a recycled guess could be drafted at all."""

from __future__ import annotations

from collections.abc import Sequence

from vllm_lookahead.core.acceptance import AcceptanceStats
from vllm_lookahead.core.recycle import TokenRecycler
from vllm_lookahead.core.tree import Source


class RecyclingGate:
    def __init__(self, recycle: TokenRecycler | None) -> None:
        self.recycle = recycle
        # Whether the last drafted step's bar let recycled guesses in (`may_pay`): the table is taught then.
        self.pays = recycle is not None

    def decide(self, floor: float, stats: Sequence[AcceptanceStats]) -> None:
        """At drafting: whether this step's verification teaches the table (`may_pay`)."""
        self.pays = self.may_pay(floor, stats)

    def may_pay(self, floor: float, stats: Sequence[AcceptanceStats]) -> bool:
        """Whether a recycled guess under x0 could clear a step's bar (`score_floor`), as its depth-1 rate in the
        step's requests' statistics (`stats`: greedy, sampled or both) says, weighed by their calibration as the
        drafting weighs every score. The target's top-k along every path is paid only where a recycled guess could
        be drafted: a large batch on a CPU, whose bar keeps them out, pays nothing, and the table stays for when the
        batch shrinks. Only the kinds of request in the step count: the sampled statistics' rate stays at its prior
        (1) in a greedy run and would let every bar in. The rule reads no table, so an empty one is taught. Under
        tensor parallelism (floor 0) every rank always teaches it, so that their tables stay equal."""
        if self.recycle is None:
            return False
        if floor <= 0:
            return True
        rate = max((s.factor(Source.RECYCLE, 1) * s.calibration for s in stats), default=0.0)
        return self.recycle.best_estimate(rate) > floor

    def top_k(self) -> int:
        """How many of the target's top tokens verification reads at each tree row for the table (0: none, where the
        last drafted step's bar kept recycled guesses out). Read in the same pass as the rows' argmax
        (`LogitRows.pick`); the table learns those of each verified path."""
        return self.recycle.top_k if self.recycle is not None and self.pays else 0
