"""The step-size benchmark (`benchmarks/matmul_sizes.py`): vLLM's CPU matmul handler timed per step size."""

from __future__ import annotations

import json

import pytest

from benchmarks.matmul_sizes import KEPT, call_plan, linear_shapes, main, parse_args


def test_linear_shapes_follow_the_config():
    shapes = linear_shapes(
        {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 96,
            "vocab_size": 500,
        }
    )
    assert shapes == {
        "qkv_proj": (128, 64),
        "o_proj": (64, 64),
        "gate_up_proj": (192, 64),
        "down_proj": (64, 96),
        "lm_head": (500, 64),
    }


def test_every_column_times_the_same_row_counts():
    plan = call_plan(reps=2)
    sizes = {c: sorted(m for col, m in plan if col == c) for c in ("first", "hit", "rebuilt")}
    assert sizes["first"] and sizes["hit"] == sizes["rebuilt"] == sorted(sizes["first"] * 2)


def test_first_calls_are_first_hits_are_kept_and_rebuilt_calls_were_dropped():
    plan = call_plan(reps=2)
    for i, (col, m) in enumerate(plan):
        before = [size for _, size in plan[:i]]
        if col == "first":
            assert m not in before
            continue
        if col is None:
            continue
        last = len(before) - 1 - before[::-1].index(m)
        others = len(set(before[last + 1 :]))  # other sizes since this size's last call
        assert others < KEPT if col == "hit" else others > KEPT


def test_it_times_every_shape_of_a_model(tmp_path, capsys):
    config = {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["--model", str(tmp_path), "--reps", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "x" in line.split("|")[1]]
    assert [r.split("|")[2].strip() for r in rows] == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"]
    for r in rows:
        hit, first, rebuilt = (float(c) for c in r.split("|")[3:6])
        assert hit > 0 and first > 0 and rebuilt > 0
    assert "a step of a new size pays about" in out


@pytest.mark.parametrize("flags", [["--reps", "0"], ["--threads", "0"]])
def test_bad_flags_are_refused(flags):
    with pytest.raises(SystemExit):
        parse_args(flags)
