"""`benchmarks/diagnostics/gpu_step_cost.py`: the timed decoder runs (on a CPU here, without CUDA graphs), and the
sizing's step cost learned from measured steps follows their cost."""

from __future__ import annotations

import json

import pytest

from tests.scripts import load_script

gpu_step_cost = load_script("benchmarks/diagnostics/gpu_step_cost.py")
fit_batch, main, parse_args = gpu_step_cost.fit_batch, gpu_step_cost.main, gpu_step_cost.parse_args


def _steps(requests: int, fixed: float, knee: int, below: float, past: float) -> list[dict]:
    out = []
    for t in (1, 2, 4, 8, 16, 32, 64):
        tokens = requests * t
        seconds = fixed + below * min(tokens, knee) + past * max(0, tokens - knee)
        out.append({"requests": requests, "tokens": tokens, "seconds": seconds})
    return out


def test_the_fit_follows_a_gpu_like_curve_and_sets_a_low_bar():
    """Nearly flat up to 16 tokens, then 50 us a token: the learned prices are the measured ones, and the bar a draft
    must clear stays far under a CPU's (0.03 at batch 1, 0.3 at 16 requests)."""
    steps = _steps(1, 0.006, 16, 0.000005, 0.00005)
    f = fit_batch(steps, 1, feed=20)
    assert f["plain_ms"] == pytest.approx(1e3 * steps[0]["seconds"], rel=0.01)
    assert f["most_ms"] == pytest.approx(1e3 * steps[-1]["seconds"], rel=0.01)
    assert f["bar"] < 0.01


def test_the_bar_rises_with_the_price_of_a_token_and_the_batch():
    cheap = fit_batch(_steps(16, 0.006, 1, 0.0001, 0.0001), 16, feed=20)
    dear = fit_batch(_steps(16, 0.006, 1, 0.001, 0.001), 16, feed=20)
    assert dear["double_ms"] - dear["plain_ms"] == pytest.approx(16.0, rel=0.05)  # 16 tokens more at 1 ms
    assert cheap["bar"] < dear["bar"]
    small = fit_batch(_steps(1, 0.006, 1, 0.0001, 0.0001), 1, feed=20)
    assert small["bar"] < cheap["bar"]


def test_measure_then_fit_on_a_cpu(tmp_path, capsys):
    out = tmp_path / "steps.json"
    main(["measure", "--shapes", "tiny", "--batches", "1,2", "--tokens", "1,4", "--context", "8", "--repeats", "2",
          "--out", str(out)])  # fmt: skip
    data = json.loads(out.read_text())
    assert data["graphs"] is False and data["context"] == 8
    steps = data["shapes"]["tiny"]["steps"]
    assert [(s["requests"], s["tokens"]) for s in steps] == [(1, 1), (1, 4), (2, 2), (2, 8)]
    assert all(s["seconds"] > 0 for s in steps)
    main(["fit", str(out)])
    printed = capsys.readouterr().out
    assert printed.count("| tiny |") == 2
    assert out.with_suffix(".png").exists()


def test_bad_arguments_are_refused():
    for bad in (["--shapes", "nope"], ["--batches", "0"], ["--tokens", "0,2"]):
        with pytest.raises(SystemExit):
            parse_args(["measure", "--out", "x.json", *bad])
