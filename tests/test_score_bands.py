"""`benchmarks/diagnostics/score_bands.py`: carried nodes binned by calibrated score (its tables, not an engine run)."""

from __future__ import annotations

from tests.scripts import load_script

score_bands = load_script("benchmarks/diagnostics/score_bands.py")


def test_nodes_fall_in_the_band_of_their_calibrated_score_and_count_when_accepted():
    bands = score_bands.Bands((0.0, 0.5, 1.0))
    bands.add([0.8, 0.4, 0.9], accepted={1, 3}, scale=0.5)  # calibrated 0.4, 0.2, 0.45: all in the low band
    bands.add([0.6, 1.0], accepted={2}, scale=1.0)  # 0.6 and 1.0: the high band, the second accepted
    assert bands.rows[0] == [3, 0.4 + 0.2 + 0.45, 2]
    assert bands.rows[1] == [2, 1.6, 1]
    table = bands.table()
    assert table[2] == "| 0.0-0.5 | 3 | 0.350 | 0.667 | 1.90 |"
    assert table[3] == "| 0.5-1.0 | 2 | 0.800 | 0.500 | 0.62 |"
