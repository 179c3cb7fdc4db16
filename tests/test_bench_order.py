"""bench_methods' rounds: each round runs the methods in an order rotated by one, so no method holds one slot."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the scripts import their siblings

from bench_methods import run_order  # noqa: E402


def test_each_round_rotates_the_order_by_one():
    methods = ["none", "suffix", "lookahead"]
    orders = [run_order(methods, r) for r in range(4)]
    assert orders[0] == methods
    assert orders[1] == ["suffix", "lookahead", "none"]
    assert orders[3] == orders[0]
    # over as many rounds as methods, every method runs once in every slot
    for slot in range(len(methods)):
        assert sorted(o[slot] for o in orders[:3]) == sorted(methods)


def test_the_order_never_loses_or_repeats_a_method():
    methods = ["none", "ngram", "suffix", "lookahead", "lookahead-twin"]
    for r in range(7):
        assert sorted(run_order(methods, r)) == sorted(methods)
