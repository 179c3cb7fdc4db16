"""`benchmarks/ab_sizing.py`: the alternation of the two bars, the scaled fit, and the tally (a step is timed by
`sizing.StepTimer`, tested in test_sizing.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the scripts import their siblings

from ab_sizing import Alternation, charged, parse_args, scaled  # noqa: E402

from vllm_lookahead.core.sizing import StepCost, score_floor  # noqa: E402


def test_the_bars_alternate_and_each_step_is_credited_to_its_own():
    ab = Alternation(0.5)
    arms = []
    for _ in range(4):
        arms.append(ab.arm())
        ab.proposals += 1
    assert arms == [0, 1, 0, 1]
    assert [ab.factor(a) for a in arms] == [1.0, 0.5, 1.0, 0.5]
    ab.credit(0, 16, 8, 20, 0.05)
    ab.credit(1, 16, 24, 24, 0.08)
    ab.credit(0, 16, 8, 22, 0.05)
    fit, scaled_bar = ab.tallies
    assert fit.steps == 2 and fit.tokens == 42
    assert fit.rate == pytest.approx(420.0)
    assert scaled_bar.rate == pytest.approx(300.0)


def test_at_scale_one_the_arms_stay_apart():
    """--scale 1 is an A/A control: both arms size alike and are still tallied apart."""
    ab = Alternation(1.0)
    assert ab.factor(0) == ab.factor(1) == 1.0
    ab.credit(0, 16, 8, 20, 0.05)
    ab.credit(1, 16, 8, 18, 0.05)
    assert [t.steps for t in ab.tallies] == [1, 1]
    assert [t.tokens for t in ab.tallies] == [20, 18]


def test_the_scaled_fit_prices_draft_tokens_alone_and_lowers_the_bar():
    cost = StepCost.frozen([0.030, 0.001, 0.002, 0.004, 6, 0.0005])
    half = scaled(cost, 0.5).coefficients()
    assert half == cost.coefficients()._replace(per_draft=0.001, per_draft_below=0.00025)
    assert score_floor(scaled(cost, 0.5), 16) < score_floor(cost, 16)
    assert scaled(cost, 1.0).coefficients() == cost.coefficients()


def test_a_scale_must_be_positive():
    assert parse_args(["--scale", "2"]).scale == 2.0
    for bad in ("0", "-1", "x"):
        with pytest.raises(SystemExit):
            parse_args(["--scale", bad])


def test_a_step_is_charged_the_drafting_that_built_its_trees():
    """A step timed at 50 ms whose own drafting (for the next step, the other bar's trees) took 3 ms, and whose trees
    took 0.5 ms to draft: its bar is charged 47.5 ms, not the other bar's drafting."""
    assert charged(0.050, 0.003, 0.0005) == pytest.approx(0.0475)
    assert charged(0.050, 0.002, 0.002) == pytest.approx(0.050)  # alike drafting: as the fit times it
