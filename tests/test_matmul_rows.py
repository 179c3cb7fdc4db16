"""The row-count diagnostic (`benchmarks/diagnostics/matmul_rows.py`): a forward's linear layers timed by a step's
tokens."""

from __future__ import annotations

import json

import pytest

from tests.scripts import load_script

matmul_rows = load_script("benchmarks/diagnostics/matmul_rows.py")
added_rate, layer_weights, line_fit = matmul_rows.added_rate, matmul_rows.layer_weights, matmul_rows.line_fit
main, parse_args = matmul_rows.main, matmul_rows.parse_args

CONFIG = {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 256}


def test_every_layer_has_its_own_weights_and_the_head_one():
    weights = layer_weights({**CONFIG, "num_hidden_layers": 3})
    assert [c for *_, c in weights] == [3, 3, 3, 3, 1]
    assert weights[-1][:2] == (256, 64)


def test_an_added_row_is_priced_by_the_rows_between_two_counts():
    # 1 row 10 ms, 3 rows 14 ms: 2 ms a row; 5 rows 14 ms: free (no rate, not a division by zero)
    out = added_rate([1, 3, 5], [10.0, 14.0, 14.0], params=1_000_000)
    assert out[0] is None
    assert out[1] == pytest.approx((2.0, 1.0))  # 2e6 FLOPs a row in 2 ms: 1 GFLOP/s
    assert out[2] == (0.0, None)


def test_it_prints_a_row_per_count(tmp_path, capsys):
    # Weights big enough that a pass takes well over the printed 0.1 ms on any CPU
    big = {**CONFIG, "hidden_size": 1024, "intermediate_size": 2048, "vocab_size": 4096, "num_hidden_layers": 2}
    (tmp_path / "config.json").write_text(json.dumps(big))
    assert main(["--model", str(tmp_path), "--rows", "1,4", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "9 weights" in out  # 4 shapes x 2 layers + the LM head
    rows = [
        line.split("|") for line in out.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()
    ]
    assert [int(r[1]) for r in rows] == [1, 4]
    assert float(rows[0][2]) > 0 and rows[0][4].strip() == ""
    assert rows[1][4].strip()  # the added rows' price
    assert "line over every count" in out


def test_the_line_is_fitted_over_every_count():
    assert line_fit([1, 2, 4], [11.0, 12.0, 14.0]) == pytest.approx((10.0, 1.0))
    assert line_fit([1, 2, 3], [1.0, 3.0, 2.0]) == pytest.approx((1.0, 0.5))  # least squares, not the end points


@pytest.mark.parametrize(
    "flags",
    [
        ["--rows", "4,2"],
        ["--rows", "0,1"],
        ["--rows", "a"],
        ["--rows", "2,2"],
        ["--rows", ",".join(map(str, range(1, 34)))],
        ["--reps", "0"],
        ["--threads", "0"],
    ],
)
def test_bad_flags_are_refused(flags):
    with pytest.raises(SystemExit):
        parse_args(flags)
