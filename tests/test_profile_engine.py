"""`benchmarks/diagnostics/profile_engine.py`: the profiled batch's steps as the engine's step-cost fit timed them."""

from __future__ import annotations

from tests.scripts import load_script

profile_engine = load_script("benchmarks/diagnostics/profile_engine.py")


def test_the_step_gap_line_reports_the_profiled_batch_alone():
    # warm-up: 10 steps of 50 ms + 1 ms; then 20 more of 40 ms + 2 ms (the totals are means over all timed steps)
    before = {"timed_steps": 10, "timed_step_span": 0.050, "timed_step_gap": 0.001}
    after = {"timed_steps": 30, "timed_step_span": (0.5 + 0.8) / 30, "timed_step_gap": (0.01 + 0.04) / 30}
    line = profile_engine.step_gap_line(before, after)
    assert line.startswith("20 decoding steps")
    assert "40.00 ms to the end of drafting, then 2.00 ms to the next step (4.8% of a step)" in line
    assert profile_engine.step_gap_line(before, before) == "no decoding step timed in the profiled batch"
