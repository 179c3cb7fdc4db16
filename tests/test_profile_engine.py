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


def test_clock_times_the_hooks_only_while_on_and_restores_them():
    """`--clock`: a clocked method is counted while on, not before; the originals are back afterwards."""
    from types import SimpleNamespace

    from vllm_lookahead.glue.engine import LookaheadEngine

    original = LookaheadEngine.__dict__["drop_requests"]
    dropped = []
    engine = SimpleNamespace(requests=SimpleNamespace(drop_finished=lambda runner, out: dropped.append(out)))
    on = [False]
    row = "- lookahead: drop_requests (in execute_model)"
    with profile_engine.clocked(lambda: on[0]) as (seconds, calls):
        LookaheadEngine.drop_requests(engine, None, "warm-up")
        on[0] = True
        LookaheadEngine.drop_requests(engine, None, "a")
        LookaheadEngine.drop_requests(engine, None, "b")
    assert dropped == ["warm-up", "a", "b"] and calls[row] == 2 and seconds[row] > 0
    assert LookaheadEngine.__dict__["drop_requests"] is original
    steps = "engine step (LLMEngine.step)"
    rows = profile_engine.clock_table({steps: 0.5, row: 0.01}, {steps: 10, row: 20})
    assert rows[0] == "| per engine step (10 steps) | ms | calls |"
    assert f"| {steps} | 50.000 | 10 |" in rows and f"| {row} | 1.000 | 20 |" in rows


def test_the_drafting_line_divides_by_steps_and_drafts():
    steps = {"engine step (LLMEngine.step)": 400}
    spec = {"drafts": 800, "draft_tokens": 3600, "accepted_tokens": 1800}
    line = profile_engine.drafting_line(spec, 3200, steps)
    assert "8.00 tokens an engine step; 800 drafts" in line
    assert "3600 draft tokens (4.50 a draft), 1800 accepted (0.50 of them, 2.25 a draft)" in line
    plain = profile_engine.drafting_line({"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}, 400, steps)
    assert plain.strip() == "1.00 tokens an engine step; 0 drafts (request-steps that drafted)"


def test_the_plugin_parts_are_clocked_where_they_are_called_and_restored():
    """`--clock --parts`: every PARTS row names a method or a module's function that exists (a module-level function
    is wrapped in the module that calls it); wrapped, a call counts; the originals are back afterwards."""
    from importlib import import_module

    from vllm_lookahead.core.tree import StepTree

    for row, module, cls, name in profile_engine.PARTS:
        owner = import_module(module) if cls is None else getattr(import_module(module), cls)
        assert callable(getattr(owner, name)), row
    row = "- ordered and cut (by_score)"
    original = StepTree.__dict__["by_score"]
    with profile_engine.clocked(lambda: True, profile_engine.PARTS) as (seconds, calls):
        StepTree.chain([5, 6, 7]).by_score(2)
    assert calls[row] == 1 and seconds[row] > 0
    assert StepTree.__dict__["by_score"] is original
    table = profile_engine.parts_table({row: 0.002}, {row: 4}, 10)
    assert f"| {row} | 200.0 | 500.0 | 4 |" in table
