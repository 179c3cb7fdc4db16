"""`benchmarks/bench_interleaved.py`: live engines taking turns on each round's new prompts, run whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import their siblings

from bench_interleaved import fastest, parse_args  # noqa: E402


def test_rounds_that_would_run_out_of_humaneval_prompts_are_refused():
    with pytest.raises(SystemExit, match="164"):
        parse_args(["--rounds", "4", "--num-prompts", "48"])
    assert parse_args(["--rounds", "4", "--num-prompts", "48", "--datasets", "sharegpt"]).rounds == 4


def test_fastest_is_the_method_with_the_most_tokens_per_second():
    rows = [
        {"dataset": "humaneval", "method": "none", "status": "ok", "tokens_per_s": 10.0},
        {"dataset": "humaneval", "method": "lookahead", "status": "ok", "tokens_per_s": 12.0},
        {"dataset": "humaneval", "method": "suffix", "status": "failed"},
    ]
    assert fastest(rows, ["humaneval", "sharegpt"]) == {"humaneval": "lookahead"}


def test_two_live_engines_take_turns_over_two_rounds(tmp_path):
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "bench_interleaved.py"), "--eager", "--methods", "none,lookahead",
        "--datasets", "humaneval", "--num-prompts", "2", "--max-tokens", "12", "--concurrency", "2", "--rounds", "2",
        "--out", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    # each engine started once, and each ran once a round
    assert done.stderr.count("=== starting lookahead ===") == 1
    for r in (1, 2):
        assert f"=== lookahead/humaneval (round {r} of 2) ===" in done.stderr
    assert "humaneval: fastest by round: " in done.stdout
    (jsonl,) = tmp_path.glob("interleaved_*.jsonl")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    la = next(r for r in rows if r["method"] == "lookahead")
    assert la["status"] == "ok" and len(la["vs_none_rounds"]) == 2 and len(la["fastest_by_round"]) == 2
    assert la["identical"] == 2  # greedy float32: plain decoding's outputs in both rounds
    assert la["output_tokens"] > 0
    assert list(tmp_path.glob("interleaved_*.png"))
