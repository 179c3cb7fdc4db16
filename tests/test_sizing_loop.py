"""`benchmarks/sizing_loop.py`: the sizing in a closed loop against a known step cost."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from sizing_loop import compare, parse_args  # noqa: E402


def test_the_fit_finds_the_true_models_rate_and_a_gross_misprice_loses():
    args = parse_args(["--steps", "1500", "--seeds", "1", "--lines", "0.25,20"])
    got = compare(args)
    assert got["true"][1] == 1.0
    assert got["fit"][1] > 0.97  # the engine's fit learns the knee's cost from the steps it chose
    assert got["20"][1] < 0.9 and got["20"][2] < got["true"][2]  # tokens priced far too high: too few drafted
    assert got["0.25"][2] > got["true"][2]  # priced as if free past the knee: too many


@pytest.mark.parametrize("flags", [["--steps", "100"], ["--decay-low", "0.9", "--decay-high", "0.5"]])
def test_bad_flags_are_refused(flags, capsys):
    with pytest.raises(SystemExit):
        parse_args(flags)
    assert "--" in capsys.readouterr().err
