"""`benchmarks/profile_engine.py --wall`: the clock timer around the plugin's per-step functions."""

from __future__ import annotations

import importlib
import sys
import time
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the scripts import their siblings

from profile_engine import WALL_TARGETS, WallTimer, step_gap_line  # noqa: E402


class _Slow:
    def work(self, seconds: float) -> str:
        time.sleep(seconds)
        return "done"

    @staticmethod
    def helper() -> int:
        return 1


def test_wrapped_calls_are_counted_timed_and_pass_through():
    timer = WallTimer()
    original = _Slow.__dict__["work"]
    timer.wrap(_Slow, "work", "Slow.work")
    obj = _Slow()
    assert obj.work(0.01) == "done" and obj.work(0.0) == "done"
    assert timer.calls["Slow.work"] == 2
    assert timer.seconds["Slow.work"] >= 0.01
    timer.restore()
    assert _Slow.__dict__["work"] is original
    obj.work(0.0)
    assert timer.calls["Slow.work"] == 2  # restored: no longer counted


def test_module_functions_are_wrapped_and_restored():
    mod = types.ModuleType("m")
    mod.f = lambda x: x + 1
    original = mod.f
    timer = WallTimer()
    timer.wrap(mod, "f", "f")
    assert mod.f(1) == 2 and timer.calls["f"] == 1
    timer.restore()
    assert mod.f is original


def test_static_methods_are_refused():
    with pytest.raises(TypeError, match="helper"):
        WallTimer().wrap(_Slow, "helper", "Slow.helper")


def test_the_table_ranks_by_time_per_step():
    timer = WallTimer()
    timer.seconds = {"a": 0.010, "b": 0.030}
    timer.calls = {"a": 10, "b": 3}
    rows = timer.table(steps=10, rows=5).splitlines()
    assert rows[2] == "| b | 3.000 | 3 | 10000.0 |"
    assert rows[3] == "| a | 1.000 | 10 | 1000.0 |"
    assert len(timer.table(steps=10, rows=1).splitlines()) == 3


def test_every_target_exists_in_the_plugin():
    # a renamed plugin function must fail here, not vanish from the benchmark's table
    for module, cls, name in WALL_TARGETS:
        owner = getattr(importlib.import_module(module), cls) if cls else importlib.import_module(module)
        fn = owner.__dict__[name] if cls else getattr(owner, name)
        assert callable(fn) and not isinstance(fn, (staticmethod, classmethod)), (module, cls, name)


def test_the_step_gap_line_reports_the_profiled_batch_alone():
    # warm-up: 10 steps of 50 ms + 1 ms; then 20 more of 40 ms + 2 ms (the totals are means over all timed steps)
    before = {"timed_steps": 10, "timed_step_span": 0.050, "timed_step_gap": 0.001}
    after = {"timed_steps": 30, "timed_step_span": (0.5 + 0.8) / 30, "timed_step_gap": (0.01 + 0.04) / 30}
    line = step_gap_line(before, after)
    assert line.startswith("20 decoding steps")
    assert "40.00 ms to the end of drafting, then 2.00 ms to the next step (4.8% of a step)" in line
    assert step_gap_line(before, before) == "no decoding step timed in the profiled batch"
