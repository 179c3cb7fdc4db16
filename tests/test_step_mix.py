"""The step-mix benchmark's fit (`benchmarks/step_mix.py`): what a step costs per request, draft and prefill token."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the scripts import their siblings

from step_mix import step_fit  # noqa: E402


def test_the_fit_recovers_a_linear_step_cost():
    counts = [(16, 0, 0), (16, 9, 0), (12, 4, 0), (3, 11, 0), (16, 5, 280), (9, 0, 90), (14, 20, 0)]
    steps = [(0.0134 + 0.00097 * r + 0.0007 * d + 0.00052 * p, r, d, p) for r, d, p in counts]
    assert step_fit(steps) == pytest.approx([13.4, 0.97, 0.7, 0.52], abs=1e-6)


def test_a_count_that_never_varies_is_folded_into_the_fixed_cost():
    # one request at a time, no prefill: the requests' share is part of the fixed cost, not split with it
    steps = [(0.018 + 0.0006 * d, 1, d, 0) for d in range(8)]
    assert step_fit(steps) == pytest.approx([18.0, 0.0, 0.6, 0.0], abs=1e-6)


def test_steps_by_draft_count():
    from step_mix import by_drafts, drafts_table

    steps = [(0.030, 1, 0, 0), (0.032, 1, 0, 0), (0.031, 1, 0, 0), (0.036, 1, 8, 0), (0.040, 1, 7, 0)]
    got = by_drafts(steps)
    assert got == {0: (31.0, 3), 7: (40.0, 1), 8: (36.0, 1)}
    table = drafts_table([{"method": "lookahead", "by_drafts": {str(k): v for k, v in got.items()}}])
    row = table.splitlines()[2].split(" | ")
    assert row[1] == "31.0 (3)" and row[2] == "" and row[8] == "36.0 (2)"  # 7-8 drafts: two steps, median 36 / 40
