"""The step-timing diagnostic (`benchmarks/diagnostics/step_timings.py`): its tables, not an engine run."""

from __future__ import annotations

import pytest

from tests.scripts import load_script

step_timings = load_script("benchmarks/diagnostics/step_timings.py")


def _rows(lines: list[str]) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_steps_are_grouped_by_batch_size_with_their_share_of_the_time():
    steps = [(64, 20, True, 0.060), (63, 10, False, 0.050), (3, 0, False, 0.010), (1, 4, False, 0.010)]
    rows = _rows(step_timings.steps_table(steps))
    assert [r[0] for r in rows] == ["1", "2-4", "49-64"]
    full = rows[2]
    assert full[1] == "2" and full[2] == "15.0" and full[3] == "55.0"  # two steps, mean drafts, ms a step
    assert full[4] == f"{110 / 127:.3f}" and full[5] == "85%"  # ms a request, share of 0.13 s
    assert rows[0][5] == "8%" and rows[1][4] == f"{10 / 3:.3f}"


def test_carried_nodes_are_grouped_by_score_with_the_share_accepted():
    nodes = [(0.65, True), (0.62, False), (0.68, False), (0.97, True), (0.05, False)]
    rows = _rows(step_timings.calibration_table(nodes))
    assert rows == [
        ["0.00-0.10", "1", "0.050", "0.000"],
        ["0.60-0.70", "3", "0.650", "0.333"],
        ["0.95-1", "1", "0.970", "1.000"],
    ]


@pytest.mark.parametrize("flags", [["--concurrency", "1"], ["--num-prompts", "0"], ["--lookahead-config", "{"]])
def test_bad_flags_are_refused(flags):
    with pytest.raises(SystemExit):
        step_timings.parse_args(flags)
