"""`benchmarks/bench_interleaved.py`: live engines taking turns on each round's new prompts, run whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import their siblings

from bench_interleaved import LiveWorker, fastest, parse_args  # noqa: E402
from bench_methods import median_rows  # noqa: E402


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


def _cell(method: str, vs_none: float, out: int, accepted: int, drafts: int, per_pos: tuple = (0,)) -> dict:
    return {
        "dataset": "humaneval", "method": method, "status": "ok", "vs_none": vs_none, "tokens_per_s": vs_none,
        "output_tokens": out, "tokens_per_forward": out / (out - accepted),
        "spec_counters": {
            "accepted_tokens": accepted, "draft_tokens": drafts, "drafts": out - accepted,
            "accepted_per_pos": list(per_pos),
        },
    }  # fmt: skip


def test_tokens_per_forward_are_pooled_over_rounds_not_the_median_rounds():
    # Each method's median round is another round (its texts differ): a's is round 2, b's round 1.
    rounds = [
        [_cell("a", 1.0, 100, 50, 200, (40, 10)), _cell("b", 2.0, 100, 20, 40)],
        [_cell("a", 2.0, 300, 100, 300, (70,)), _cell("b", 1.0, 300, 100, 200)],
        [_cell("a", 3.0, 200, 100, 300), _cell("b", 3.0, 200, 100, 200)],
    ]
    a, b = median_rows(rounds)
    assert a["vs_none"] == 2.0 and b["vs_none"] == 2.0  # the median rounds: 2 and 1
    assert a["tokens_per_forward"] == 600 / 350 and b["tokens_per_forward"] == 600 / 380
    assert a["drafts_per_step"] == 800 / 350 and a["acceptance"] == 250 / 800
    assert b["tokens_per_forward_rounds"] == [100 / 80, 300 / 200, 200 / 100]
    # acceptance by position too: every round's counts (a shorter list counts as zeros) over all drafting steps
    assert a["accepted_per_pos"] == [110 / 350, 10 / 350]


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


FAKE_WORKER = """
import json, os, subprocess, sys
base = sys.argv[sys.argv.index("--result-file") + 1]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # as an engine's process would
open(base + ".tmp", "w").write(json.dumps({"status": "ok", "child": child.pid}))
os.replace(base + ".tmp", base)
while line := sys.stdin.readline():
    r, dataset = line.split()
    open(f"{base}.{r}.{dataset}.tmp", "w").write(json.dumps({"status": "ok", "round": int(r)}))
    os.replace(f"{base}.{r}.{dataset}.tmp", f"{base}.{r}.{dataset}")
child.kill()
"""


def _state(pid: int) -> str:
    """The process's state letter once it has settled (a signal takes effect when the process is next scheduled)."""
    import time

    for _ in range(50):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if (state := stat[stat.rfind(")") + 2]) in "TZ":
            return state
        time.sleep(0.02)
    return state


def test_a_live_worker_and_its_children_are_stopped_between_turns(tmp_path):
    """Idle engines must take no CPU from the one being timed: stopped after starting and after each turn."""
    script = tmp_path / "worker.py"
    script.write_text(FAKE_WORKER)
    w = LiveWorker("fake", [], tmp_path, cmd=[sys.executable, str(script)])
    try:
        assert w.live
        pids = (w.proc.pid, w.start["child"])
        assert [_state(p) for p in pids] == ["T", "T"]
        for r in (0, 1):
            assert w.run(r, "humaneval") == {"status": "ok", "round": r}
            assert [_state(p) for p in pids] == ["T", "T"]
    finally:
        w.close()
    assert w.proc.returncode == 0  # resumed to close: it read the end of its input and exited


def test_none_sync_is_plain_decoding_without_async_scheduling():
    """vLLM turns async scheduling on for plain decoding only; none-sync turns it off, an argument vLLM must know."""
    import dataclasses

    from bench_methods import METHODS, engine_options
    from vllm.engine.arg_utils import EngineArgs

    assert METHODS["none-sync"] is None  # no speculative_config: plain decoding
    assert engine_options("none-sync") == {"async_scheduling": False}
    assert engine_options("none") == {} and engine_options("lookahead") == {}
    assert "async_scheduling" in {f.name for f in dataclasses.fields(EngineArgs)}


def test_lookahead_corpus_loads_sharegpt_answers_apart_from_the_prompts(tmp_path, monkeypatch):
    import bench_methods

    from vllm_lookahead.core.corpus import read_corpus
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.tools.prompts import sharegpt_answers

    monkeypatch.setattr(bench_methods.Path, "home", lambda: tmp_path)
    monkeypatch.setattr(bench_methods, "CORPUS_ANSWERS", 3)
    spec = bench_methods.speculative_config("lookahead-corpus", parse_args(["--methods", "lookahead-corpus"]))
    assert spec["method"] == "lookahead" and spec["suffix_corpus"].startswith(str(tmp_path))
    assert read_corpus(spec["suffix_corpus"]) == sharegpt_answers(3)
    assert LookaheadParams.from_mapping({k: v for k, v in spec.items() if k != "method"}).suffix_corpus
