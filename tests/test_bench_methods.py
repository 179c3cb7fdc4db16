"""`benchmarks/bench_methods.py`: methods compared in interleaved rounds (live engines taking turns on each round's
new prompts), output lengths, the rounds' order and medians, and a whole run on the real engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.scripts import ROOT, load_script

bm = load_script("benchmarks/bench_methods.py")


def test_rounds_that_would_run_out_of_humaneval_prompts_are_refused(capsys):
    with pytest.raises(SystemExit):
        bm.parse_args(["--rounds", "4", "--num-prompts", "48"])
    assert "164" in capsys.readouterr().err
    assert bm.parse_args(["--rounds", "4", "--num-prompts", "48", "--datasets", "sharegpt"]).rounds == 4
    # fresh engines take the same prompts every round
    assert bm.parse_args(["--rounds", "4", "--num-prompts", "48", "--fresh-engines"]).rounds == 4


def test_interleaved_rounds_take_new_prompts_fresh_engines_the_same():
    assert [bm.prompt_round(bm.parse_args(["--rounds", "3"]), r) for r in range(3)] == [0, 1, 2]
    assert [bm.prompt_round(bm.parse_args(["--rounds", "3", "--fresh-engines"]), r) for r in range(3)] == [0, 0, 0]


def test_one_length_for_every_prompt_by_default():
    args = bm.parse_args(["--max-tokens", "96"])
    assert bm.output_lengths(args, 5) == [96] * 5
    assert bm.tokens_label(args) == "96 tokens"
    assert "_r" not in bm.run_stem(args).removesuffix("_R1")


def test_a_range_ratio_spreads_the_lengths_the_same_way_for_every_method():
    args = bm.parse_args(["--max-tokens", "96", "--range-ratio", "0.5"])
    lengths = bm.output_lengths(args, 48)
    other = bm.parse_args(["--max-tokens", "96", "--range-ratio", "0.5", "--methods", "none"])
    assert lengths == bm.output_lengths(other, 48)
    assert min(lengths) >= 48 and max(lengths) <= 144
    assert len(set(lengths)) > 20  # spread, not one length
    assert bm.tokens_label(args) == "48-144 tokens"
    assert "_r0.5_" in bm.run_stem(args)


@pytest.mark.parametrize("ratio", ["-0.1", "1", "1.5"])
def test_a_ratio_outside_0_1_is_refused(ratio, capsys):
    with pytest.raises(SystemExit):
        bm.parse_args(["--range-ratio", ratio])
    assert "--range-ratio" in capsys.readouterr().err


def test_the_file_name_says_the_rounds_and_the_mode():
    assert bm.run_stem(bm.parse_args(["--rounds", "3"])).endswith("_R3")
    assert bm.run_stem(bm.parse_args(["--rounds", "2", "--fresh-engines"])).endswith("_R2_fresh")


def test_each_round_rotates_the_order_by_one():
    methods = ["none", "suffix", "lookahead"]
    orders = [bm.run_order(methods, r) for r in range(4)]
    assert orders[0] == methods
    assert orders[1] == ["suffix", "lookahead", "none"]
    assert orders[3] == orders[0]
    # over as many rounds as methods, every method runs once in every slot
    for slot in range(len(methods)):
        assert sorted(o[slot] for o in orders[:3]) == sorted(methods)
    for r in range(7):
        assert sorted(bm.run_order([*methods, "ngram", "lookahead-twin"], r)) == sorted([*methods, "ngram",
                                                                                         "lookahead-twin"])  # fmt: skip


def test_fastest_is_the_method_with_the_most_tokens_per_second():
    rows = [
        {"dataset": "humaneval", "method": "none", "status": "ok", "tokens_per_s": 10.0},
        {"dataset": "humaneval", "method": "lookahead", "status": "ok", "tokens_per_s": 12.0},
        {"dataset": "humaneval", "method": "suffix", "status": "failed"},
    ]
    assert bm.fastest(rows, ["humaneval", "sharegpt"]) == {"humaneval": "lookahead"}


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
    a, b = bm.median_rows(rounds)
    assert a["vs_none"] == 2.0 and b["vs_none"] == 2.0  # the median rounds: 2 and 1
    assert a["tokens_per_forward"] == 600 / 350 and b["tokens_per_forward"] == 600 / 380
    assert a["drafts_per_step"] == 800 / 350 and a["acceptance"] == 250 / 800
    assert b["tokens_per_forward_rounds"] == [100 / 80, 300 / 200, 200 / 100]
    # acceptance by position too: every round's counts (a shorter list counts as zeros) over all drafting steps
    assert a["accepted_per_pos"] == [110 / 350, 10 / 350]


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
    (tmp_path / "fake.json").write_text('{"status": "stale"}')  # an earlier fresh engine's start file
    w = bm.LiveWorker("fake", [], tmp_path, cmd=[sys.executable, str(script)])
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


@pytest.mark.parametrize("fresh", [False, True], ids=["interleaved", "fresh"])
def test_rounds_start_each_engine_once_or_every_round(tmp_path, capsys, fresh):
    script = tmp_path / "worker.py"
    script.write_text(FAKE_WORKER)
    flags = ["--methods", "none,lookahead", "--datasets", "humaneval,sharegpt", "--rounds", "2"]
    args = bm.parse_args(flags + (["--fresh-engines"] if fresh else []))
    rounds = bm.run_rounds(args, [], tmp_path, cmd=[sys.executable, str(script)])
    err = capsys.readouterr().err
    assert err.count("=== starting lookahead ===") == (2 if fresh else 1)
    turns = [line.strip("= ") for line in err.splitlines() if "(round" in line]
    order = [
        t.split(" ")[0].replace("lookahead", "L").replace("humaneval", "h").replace("sharegpt", "s") for t in turns
    ]
    if fresh:  # a method's engine runs both sets in its turn; round 2's order rotated
        assert order == ["none/h", "none/s", "L/h", "L/s", "L/h", "L/s", "none/h", "none/s"]
    else:  # the methods take turns on each set, round 2's order rotated
        assert order == ["none/h", "L/h", "none/s", "L/s", "L/h", "none/h", "L/s", "none/s"]
    for r, res in enumerate(rounds):
        assert set(res) == {"none", "lookahead"}
        assert res["lookahead"]["datasets"]["sharegpt"] == {"status": "ok", "round": r}


@pytest.mark.engine
def test_two_engines_take_turns_over_two_rounds(tmp_path):
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "bench_methods.py"), "--eager", "--methods", "none,lookahead",
        "--datasets", "humaneval", "--num-prompts", "2", "--max-tokens", "12", "--concurrency", "2", "--rounds", "2",
        "--out", str(tmp_path),
    ]  # fmt: skip
    # each engine's core in its worker process (not a process of its own): less start-up here, the same turns
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stderr.count("=== starting lookahead ===") == 1  # started once
    for r in (1, 2):
        assert f"=== lookahead/humaneval (round {r} of 2) ===" in done.stderr
    assert "humaneval: fastest by round: " in done.stdout
    (jsonl,) = tmp_path.glob("methods_*.jsonl")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    la = next(r for r in rows if r["method"] == "lookahead")
    assert la["status"] == "ok" and len(la["vs_none_rounds"]) == 2 and len(la["fastest_by_round"]) == 2
    assert la["identical"] == 2  # greedy float32: plain decoding's outputs in both rounds
    assert la["output_tokens"] > 0
    assert list(tmp_path.glob("methods_*.png"))
