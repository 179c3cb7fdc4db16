"""Compare speculative methods in vLLM (offline `LLM`) on the same real prompts.

    python benchmarks/bench_methods.py --methods none,ngram,suffix --datasets humaneval,sharegpt

Each method runs in a fresh subprocess (this script with `--worker METHOD`), so engines never overlap in
memory and a crash in one method is reported as a row, not fatal. Prints a markdown table, saves a PNG chart
and appends one JSON line per (dataset, method) to a JSONL file; both are named after the run settings.
See benchmarks/README.md for the columns.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from itertools import zip_longest
from pathlib import Path
from typing import Any

from _results import append_jsonl  # the scripts run from benchmarks/, which is on sys.path

from vllm_lookahead.tools import cpu_runtime

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# method name -> speculative_config (None: plain decoding)
METHODS: dict[str, dict[str, Any] | None] = {
    "none": None,
    # Plain decoding with this plugin not loaded (VLLM_PLUGINS excludes it): shows the plugin changes nothing
    # for runs that do not ask for lookahead.
    "none-noplugin": None,
    # Plain decoding without vLLM's async scheduling, which vLLM turns on for plain decoding only (never for ngram,
    # suffix or lookahead): whether the overlap pays on this machine, against none in one run.
    "none-sync": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    "suffix": {"method": "suffix", "num_speculative_tokens": 8},
    # Provided by this plugin (its defaults; --lookahead-config overrides keys).
    "lookahead": {"method": "lookahead"},
    # Lookahead with the tree rows' attention on the plain-torch reference path (VLLM_LOOKAHEAD_TREE_KERNEL=0): the
    # compiled kernel's before/after in one run.
    "lookahead-reference": {"method": "lookahead"},
    # Lookahead without token recycling (the source's before/after in one run).
    "lookahead-norecycle": {"method": "lookahead", "recycle_candidates": 0},
    # Lookahead without prompt lookup (its suffix trees cover the same text): the source's before/after in one run.
    "lookahead-nolookup": {"method": "lookahead", "lookup_candidates": 0},
    # Lookahead with its step cost fitted as a straight line, no knee (VLLM_LOOKAHEAD_COST_KNEE=0): the knee's
    # before/after in one run.
    "lookahead-line": {"method": "lookahead"},
    # Lookahead as it is, a second time in each round: an A/A control, the noise floor of a comparison in one run.
    "lookahead-twin": {"method": "lookahead"},
    # Lookahead that drafts nothing from 2 concurrent requests on (a 2-token step budget, x0s included): what the
    # plugin costs a batch by itself (its states still learn every step) against plain decoding.
    "lookahead-nodraft": {"method": "lookahead", "step_token_budget": 2},
    # Lookahead with a suffix corpus (`suffix_corpus`): ChatGPT's first answers of CORPUS_ANSWERS ShareGPT
    # conversations apart from every benchmark prompt (`prompts.sharegpt_answers`), written once by `corpus_file`.
    "lookahead-corpus": {"method": "lookahead"},
}
CORPUS_ANSWERS = 2000
# method -> (module that must be importable, how to get it)
REQUIRES: dict[str, tuple[str, str]] = {
    "suffix": ("arctic_inference", "pip install arctic-inference==0.3.0 --no-deps"),
}
DEFAULT_METHODS = "none,ngram,suffix,lookahead"
DATASETS = ("humaneval", "sharegpt")
# Repetitive, so speculative methods draft and verify during warm-up; unrelated to the datasets, so methods
# that learn from earlier outputs (suffix) gain nothing on the measured prompts.
WARMUP_PROMPT = "Repeat: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat,"
SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def parse_args(argv: list[str] | None = None, doc: str | None = __doc__) -> argparse.Namespace:
    """The flags; `doc`: the help's description (another script's, for one that shares them)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma list from: {', '.join(METHODS)}")
    p.add_argument("--datasets", default=",".join(DATASETS), help=f"comma list from: {', '.join(DATASETS)}")
    p.add_argument("--num-prompts", type=int, default=10, help="prompts per dataset")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt")
    p.add_argument(
        "--range-ratio",
        type=float,
        default=0.0,
        help="0: every prompt gets --max-tokens; R in (0, 1): prompt i gets a length drawn uniformly from "
        "[max_tokens * (1 - R), max_tokens * (1 + R)] (seeded: the same for every method), as vLLM's "
        "`vllm bench serve --random-range-ratio` varies output lengths. With one length for all, a batch's "
        "requests finish together and the next ones are admitted together, which favours plain decoding (see "
        "benchmarks/README.md)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (outputs compared with none)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p of sampled requests")
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="1: one request at a time, each timed end to end; N>1: all prompts at once, max_num_seqs=N",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument(
        "--eager",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="enforce_eager (default: compiled; the first compiled start takes about 80 s, cached after)",
    )
    p.add_argument("--lookahead-config", default=None, help="JSON merged into lookahead's speculative_config")
    p.add_argument(
        "--runtime",
        default="project",
        choices=["project", "vllm"],
        help="project: the CPU runtime `make` sets up (vllm_lookahead.tools.cpu_runtime: TCMalloc + Intel OpenMP "
        "preloaded, all cores on a small machine); vllm: vLLM's defaults as they are",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every method this many times, round by round (each round's order rotated by one method); each "
        "cell is the round with the median ratio to "
        "that round's none (the lower middle one for an even number): the machine's slow spells then weigh on "
        "the ratios, not on one method",
    )
    p.add_argument("--out", default="benchmarks/results/", help="folder for the PNG and the JSONL")
    # Internal: run one method and write its raw results as JSON.
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.method_list = [m.strip() for m in args.methods.split(",") if m.strip()]
    args.dataset_list = [d.strip() for d in args.datasets.split(",") if d.strip()]
    for m in args.method_list:
        if m not in METHODS:
            p.error(f"unknown method '{m}'; known: {', '.join(METHODS)}")
    for d in args.dataset_list:
        if d not in DATASETS:
            p.error(f"unknown dataset '{d}'; known: {', '.join(DATASETS)}")
    if min(args.concurrency, args.num_prompts, args.max_tokens, args.rounds) < 1:
        p.error("--concurrency, --num-prompts, --max-tokens and --rounds must be positive")
    if not 0 <= args.range_ratio < 1:
        p.error("--range-ratio must be in [0, 1)")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        p.error("--temperature must be >= 0 and --top-p in (0, 1]")
    if args.lookahead_config is not None:
        try:
            extra = json.loads(args.lookahead_config)
        except json.JSONDecodeError as e:
            p.error(f"--lookahead-config is not JSON: {e}")
        if not isinstance(extra, dict):
            p.error("--lookahead-config must be a JSON object")
    return args


def speculative_config(method: str, args: argparse.Namespace) -> dict[str, Any] | None:
    spec = METHODS[method]
    if spec is None:
        return None
    spec = dict(spec)
    if method == "lookahead-corpus":
        spec["suffix_corpus"] = str(corpus_file(CORPUS_ANSWERS))
    if method.startswith("lookahead") and args.lookahead_config:
        spec.update(json.loads(args.lookahead_config))
    return spec


def corpus_file(n: int) -> Path:
    """A JSON Lines suffix corpus of n ShareGPT answers apart from the benchmark prompts, written on first use."""
    from vllm_lookahead.tools.prompts import sharegpt_answers

    path = Path.home() / ".cache" / "vllm-lookahead" / f"corpus_sharegpt_answers_{n}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(a) + "\n" for a in sharegpt_answers(n)), encoding="utf-8")
        tmp.replace(path)
    return path


def model_path(args: argparse.Namespace) -> str:
    if args.model:
        return str(args.model)
    from vllm_lookahead.tools.models import default_model_path

    return default_model_path()


# ----------------------------------------------------------------------------------------------- worker side


def load_prompts(dataset: str, n: int, tokenizer: Any) -> list[str]:
    from vllm_lookahead.tools.prompts import as_chat, humaneval_prompts, sharegpt_prompts

    if dataset == "humaneval":
        return humaneval_prompts(n)  # raw code completion
    return [as_chat(tokenizer, text) for text in sharegpt_prompts(n)]


def spec_counters(llm: Any) -> dict[str, Any]:
    """Speculative-decoding counters summed over engines (label sets); zeros when the engine has none."""
    from vllm.v1.metrics.reader import Counter, Vector

    totals: dict[str, Any] = {key: 0 for key in SPEC_COUNTERS}
    per_pos: list[int] = []
    names = {name: key for key, name in SPEC_COUNTERS.items()}
    for metric in llm.get_metrics():
        if isinstance(metric, Counter) and metric.name in names:
            totals[names[metric.name]] += metric.value
        elif isinstance(metric, Vector) and metric.name == SPEC_PER_POS:
            per_pos += [0] * (len(metric.values) - len(per_pos))
            for i, v in enumerate(metric.values):
                per_pos[i] += v
    totals["accepted_per_pos"] = per_pos
    return totals


def length_bounds(args: argparse.Namespace) -> tuple[int, int]:
    """The range prompts' max_tokens are drawn from: [L(1 - R), L(1 + R)] for --max-tokens L, --range-ratio R."""
    lo = max(1, round(args.max_tokens * (1 - args.range_ratio)))
    return lo, max(lo, round(args.max_tokens * (1 + args.range_ratio)))


def output_lengths(args: argparse.Namespace, n: int) -> list[int]:
    """Each of n prompts' max_tokens: --max-tokens, or with --range-ratio a seeded draw from `length_bounds` (the
    same lengths for every method, as the prompts come in the same order)."""
    if args.range_ratio <= 0:
        return [args.max_tokens] * n
    lo, hi = length_bounds(args)
    rng = random.Random(0)
    return [rng.randint(lo, hi) for _ in range(n)]


def tokens_label(args: argparse.Namespace) -> str:
    lo, hi = length_bounds(args)
    return f"{lo}-{hi} tokens" if args.range_ratio > 0 else f"{args.max_tokens} tokens"


def run_dataset(llm: Any, prompts: list[str], args: argparse.Namespace, label: str) -> dict[str, Any]:
    from tqdm import tqdm
    from vllm import SamplingParams

    params = [
        SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=n)
        for n in output_lengths(args, len(prompts))
    ]
    before = spec_counters(llm)
    per_prompt: list[dict[str, Any]] = []
    token_ids: list[list[int]] = []
    if args.concurrency == 1:
        elapsed = 0.0
        for prompt in tqdm(prompts, desc=label, unit="prompt"):
            t0 = time.perf_counter()
            out = llm.generate([prompt], params[len(token_ids)], use_tqdm=False)[0]
            dt = time.perf_counter() - t0
            elapsed += dt
            token_ids.append(list(out.outputs[0].token_ids))
            n_prompt, n_out = len(out.prompt_token_ids), len(token_ids[-1])
            per_prompt.append({"prompt_tokens": n_prompt, "output_tokens": n_out, "time_s": dt})
    else:
        print(f"{label}: {len(prompts)} prompts at once", file=sys.stderr)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=True)
        elapsed = time.perf_counter() - t0
        for out in outs:
            token_ids.append(list(out.outputs[0].token_ids))
            n_prompt, n_out = len(out.prompt_token_ids), len(token_ids[-1])
            per_prompt.append({"prompt_tokens": n_prompt, "output_tokens": n_out})
    after = spec_counters(llm)
    spec = {key: after[key] - before[key] for key in SPEC_COUNTERS}
    pos_after, pos_before = after["accepted_per_pos"], before["accepted_per_pos"]
    pos_before = pos_before + [0] * (len(pos_after) - len(pos_before))
    spec["accepted_per_pos"] = [a - b for a, b in zip(pos_after, pos_before, strict=True)]
    return {
        "status": "ok",
        "output_tokens": sum(p["output_tokens"] for p in per_prompt),
        "time_s": elapsed,
        "spec": spec,
        "per_prompt": per_prompt,
        "token_ids": token_ids,
    }


def engine_options(method: str) -> dict[str, Any]:
    """The method's `LLM` arguments beside the shared ones."""
    return {"async_scheduling": False} if method == "none-sync" else {}


def start_engine(method: str, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The method's warmed-up engine and its result so far (status, spec_config); the engine is None when the method
    is skipped or its engine did not start (the result says why)."""
    if args.temperature > 0:
        # vLLM 0.32's CPU rejection sampler spreads uninitialised temperatures over the drafts (README, "Which
        # requests use it"); lookahead never relies on it, and this fixes it for ngram and suffix too.
        os.environ["VLLM_LOOKAHEAD_FIX_CPU_SAMPLING"] = "1"
    if method == "none-noplugin":
        os.environ["VLLM_PLUGINS"] = "no-plugin-at-all"  # a filter matching no installed plugin
    if method == "lookahead-reference":
        os.environ["VLLM_LOOKAHEAD_TREE_KERNEL"] = "0"
    if method == "lookahead-line":
        os.environ["VLLM_LOOKAHEAD_COST_KNEE"] = "0"
    result: dict[str, Any] = {"method": method, "spec_config": speculative_config(method, args)}
    if method in REQUIRES:
        module, how = REQUIRES[method]
        if importlib.util.find_spec(module) is None:
            return None, {**result, "status": "skipped", "reason": f"{module} is not installed ({how})"}

    from vllm import LLM

    try:
        llm = LLM(
            model=model_path(args),
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            max_num_seqs=args.concurrency,
            seed=0,
            enforce_eager=args.eager,
            disable_log_stats=False,  # get_metrics() needs the stat loggers
            speculative_config=result["spec_config"],
            **engine_options(method),
        )
    except Exception as e:  # report it and go on with the other methods
        text = _one_line(e)
        rejected = method != "none" and ("speculative" in text.lower() or method in text.lower())
        if rejected:
            return None, {**result, "status": "skipped", "reason": f"engine rejected it: {text}"}
        return None, {**result, "status": "failed", "reason": f"engine did not start: {text}"}

    from vllm import SamplingParams

    # Warm up in the measured mode: N concurrent requests when --concurrency N.
    warmup = [WARMUP_PROMPT] * args.concurrency
    llm.generate(warmup, SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False)
    return llm, {**result, "status": "ok"}


def measure(llm: Any, method: str, dataset: str, prompts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """One dataset's run (`run_dataset`), a failure reported as its status, with lookahead's worker counters."""
    try:
        data = run_dataset(llm, prompts, args, f"{method}/{dataset}")
    except Exception as e:
        data = {"status": "failed", "reason": _one_line(e)}
    if method.startswith("lookahead"):
        # the worker's counters after this dataset: the step-cost line its sizing used, acceptance per source
        data["lookahead_stats"] = llm.collective_rpc("lookahead_stats")[0]
    return data


def worker(args: argparse.Namespace) -> int:
    method = args.worker
    llm, result = start_engine(method, args)
    if llm is not None:
        tokenizer = llm.get_tokenizer()
        result["datasets"] = {
            d: measure(llm, method, d, load_prompts(d, args.num_prompts, tokenizer), args) for d in args.dataset_list
        }
    Path(args.result_file).write_text(json.dumps(result))
    return 0


def _one_line(e: BaseException, limit: int = 400) -> str:
    text = f"{type(e).__name__}: " + " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------------- main side


def run_child(cmd: list[str]) -> tuple[int, str]:
    """Run cmd with its output forwarded to our stderr as it comes; return its exit code and output tail.

    The child gets a session of its own so that, once it exits, whatever it left behind (an engine core whose
    parent crashed waits minutes before giving up) is ended with it and cannot hold memory or our pipe.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    stream, tail = proc.stdout, bytearray()

    def pump() -> None:
        while chunk := stream.read1(65536):
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
            tail.extend(chunk)
            del tail[:-4000]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    reader.join(timeout=10)
    return rc, bytes(tail).decode(errors="replace")


def run_method(method: str, argv: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-methods-") as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--worker", method]
        rc, tail = run_child(cmd + ["--result-file", str(result_file)])
        if result_file.exists():
            return json.loads(result_file.read_text())
    lines = [line for line in tail.replace("\r", "\n").splitlines() if line.strip()]
    how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
    reason = f"worker {how}" + (f"; its last output: {lines[-1].strip()[:300]}" if lines else "")
    return {"method": method, "status": "failed", "reason": reason}


def build_rows(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for dataset in args.dataset_list:
        base = results.get("none", {}).get("datasets", {}).get(dataset, {})
        base_ok = base.get("status") == "ok"
        for method in args.method_list:
            res = results[method]
            data = res.get("datasets", {}).get(dataset) if res["status"] == "ok" else None
            row: dict[str, Any] = {"dataset": dataset, "method": method}
            row["spec_config"] = res.get("spec_config")
            if data is None or data["status"] != "ok":
                row.update(status=res["status"] if data is None else data["status"])
                row["reason"] = (data or res).get("reason", "")
                rows.append(row)
                continue
            out, spec = data["output_tokens"], data["spec"]
            tps = out / data["time_s"] if data["time_s"] > 0 else float("nan")
            row.update(
                status="ok",
                prompts=len(data["token_ids"]),
                output_tokens=out,
                time_s=data["time_s"],
                tokens_per_s=tps,
                **count_rates(out, spec),
                spec_counters=spec,
                per_prompt=data["per_prompt"],
            )
            if data.get("lookahead_stats"):
                row["lookahead_stats"] = data["lookahead_stats"]
            if base_ok:
                row["vs_none"] = tps / (base["output_tokens"] / base["time_s"])
                if args.temperature == 0:  # unseeded samples differ from run to run by design
                    row["identical"] = sum(a == b for a, b in zip(data["token_ids"], base["token_ids"], strict=True))
            rows.append(row)
    return rows


def median_rows(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (dataset, method): the round whose ratio to its own round's none is the median (none: the
    median tokens/s), with every round's ratio and tokens/s beside it and the fewest identical outputs of any
    round. Tokens per forward, drafts a step and acceptance (overall and by position) are pooled over all rounds
    instead (each round's own tokens per forward in `tokens_per_forward_rounds`): every method ran every round's
    prompts, while each method's median round may be another round, with other prompts, so the median round's
    would compare different texts."""
    if len(rounds) == 1:
        return rounds[0]
    rows = []
    for cells in zip(*rounds, strict=True):
        ok = [c for c in cells if c["status"] == "ok"]
        if not ok:
            rows.append(cells[0])
            continue
        key = "vs_none" if all("vs_none" in c for c in ok) and cells[0]["method"] != "none" else "tokens_per_s"
        ranked = sorted(ok, key=lambda c: c[key])
        row = dict(ranked[(len(ranked) - 1) // 2])
        row["rounds"] = len(cells)
        row["vs_none_rounds"] = [c.get("vs_none") for c in ok]
        row["tokens_per_s_rounds"] = [c["tokens_per_s"] for c in ok]
        if all("identical" in c for c in ok):
            row["identical"] = min(c["identical"] for c in ok)
        row.update(pooled_counts(ok))
        rows.append(row)
    return rows


def count_rates(out: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Tokens per forward, drafts a step (tree nodes besides x0 per request-step: the tree size actually carried),
    acceptance and acceptance by draft position, from `out` output tokens and vLLM's speculative counters."""
    forwards = out - spec["accepted_tokens"]
    drafts, draft_tokens = spec["drafts"], spec["draft_tokens"]
    return {
        "tokens_per_forward": out / forwards if forwards > 0 else float("nan"),
        "drafts_per_step": draft_tokens / forwards if forwards > 0 else float("nan"),
        "acceptance": spec["accepted_tokens"] / draft_tokens if draft_tokens else None,
        "accepted_per_pos": [a / drafts for a in spec["accepted_per_pos"]] if drafts else [],
    }


def pooled_counts(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """`count_rates` over all of `cells` (rounds) together, and each round's tokens per forward; nothing where a
    round lacks the counts."""
    if not cells or any("spec_counters" not in c or "output_tokens" not in c for c in cells):
        return {}
    specs = [c["spec_counters"] for c in cells]
    summed = {k: sum(s[k] for s in specs) for k in ("accepted_tokens", "draft_tokens", "drafts")}
    summed["accepted_per_pos"] = [sum(p) for p in zip_longest(*(s["accepted_per_pos"] for s in specs), fillvalue=0)]
    return {
        **count_rates(sum(c["output_tokens"] for c in cells), summed),
        "tokens_per_forward_rounds": [c["tokens_per_forward"] for c in cells],
    }


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _spread(values: list[float | None] | None) -> str:
    """' (lowest-highest)' over the rounds, when there were several."""
    vals = [v for v in values or [] if v is not None]
    return f" ({min(vals):.2f}-{max(vals):.2f})" if len(vals) > 1 else ""


def _per_pos(rates: list[float], shown: int = 8) -> str:
    """The first `shown` per-position acceptance rates (the JSONL keeps them all)."""
    if not rates:
        return "-"
    text = " ".join(f"{a:.2f}" for a in rates[:shown])
    return text + (f" ... ({len(rates)})" if len(rates) > shown else "")


def markdown_table(rows: list[dict[str, Any]]) -> str:
    head = [
        "dataset", "method", "status", "out tokens", "time s", "tokens/s", "vs none", "tokens/forward",
        "drafts/step", "acceptance", "accepted per position", "identical to none",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["status"] != "ok":
            cells = [r["dataset"], r["method"], r["status"]] + [""] * (len(head) - 3)
        else:
            identical = f"{r['identical']}/{r['prompts']}" if "identical" in r else "n/a"
            cells = [
                r["dataset"],
                r["method"],
                "ok",
                str(r["output_tokens"]),
                f"{r['time_s']:.2f}",
                f"{r['tokens_per_s']:.1f}",
                _fmt(r.get("vs_none"), ".2f") + _spread(r.get("vs_none_rounds")),
                f"{r['tokens_per_forward']:.2f}",
                f"{r['drafts_per_step']:.1f}",
                _fmt(r["acceptance"], ".2f"),
                _per_pos(r["accepted_per_pos"]),
                identical,
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def save_chart(rows: list[dict[str, Any]], args: argparse.Namespace, path: Path, title: str) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    methods = [m for m in args.method_list if any(r["method"] == m for r in ok)]
    if not ok:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / len(methods)
    panels = [("vs_none", "tokens/s relative to none"), ("tokens_per_forward", "tokens per target forward")]
    for ax, (key, label) in zip(axes, panels, strict=True):
        for j, method in enumerate(methods):
            xs, ys = [], []
            for i, dataset in enumerate(args.dataset_list):
                for r in ok:
                    if r["dataset"] == dataset and r["method"] == method and r.get(key) is not None:
                        xs.append(i + (j - (len(methods) - 1) / 2) * width)
                        ys.append(r[key])
            bars = ax.bar(xs, ys, width, label=method)
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(args.dataset_list)), args.dataset_list)
        ax.set_ylabel(label)
        ax.set_title(label)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(methods), frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def apply_runtime(args: argparse.Namespace) -> str:
    """Set the runtime the workers start under (as a user's shell would); the line that says which it is."""
    if args.runtime == "project":
        os.environ.update(cpu_runtime.environment())
    kernel = "off" if os.environ.get("VLLM_LOOKAHEAD_TREE_KERNEL") == "0" else "on"
    return f"{cpu_runtime.describe({})}; tree kernel {kernel}"


def run_stem(args: argparse.Namespace) -> str:
    mode = "eager" if args.eager else "compiled"
    return (
        f"methods_{'-'.join(args.method_list)}_{'-'.join(args.dataset_list)}_{args.dtype}_{mode}"
        f"_c{args.concurrency}_n{args.num_prompts}_t{args.max_tokens}"
        + (f"_r{args.range_ratio:g}" if args.range_ratio > 0 else "")
        + (f"_T{args.temperature:g}_p{args.top_p:g}" if args.temperature > 0 else "")
        + ("_vllm-runtime" if args.runtime == "vllm" else "")
        + ("_tree-kernel-off" if os.environ.get("VLLM_LOOKAHEAD_TREE_KERNEL") == "0" else "")
    )


def run_order(methods: list[str], round_index: int) -> list[str]:
    """The methods in round `round_index`'s order: the list rotated by one a round, so that no method holds one slot
    in every round (the machine's state may differ between the first and the last worker of a round)."""
    k = round_index % len(methods)
    return methods[k:] + methods[:k]


def run_settings(args: argparse.Namespace, model: str, runtime: str) -> dict[str, Any]:
    """The settings a results JSONL line records beside its rows."""
    return {
        "model": model,
        "dtype": args.dtype,
        "eager": args.eager,
        "concurrency": args.concurrency,
        "num_prompts": args.num_prompts,
        "max_tokens": args.max_tokens,
        "range_ratio": args.range_ratio,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "runtime": runtime,
        "rounds": args.rounds,
        "max_model_len": args.max_model_len,
        "cpu_count": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return worker(args)

    model = model_path(args)  # prepare the default model once, before the workers need it
    runtime = apply_runtime(args)
    rounds: list[list[dict[str, Any]]] = []
    for r in range(args.rounds):
        results: dict[str, dict[str, Any]] = {}
        for method in run_order(args.method_list, r):
            print(f"=== {method}" + (f" (round {r + 1} of {args.rounds})" if args.rounds > 1 else "") + " ===",
                  file=sys.stderr)  # fmt: skip
            results[method] = run_method(method, argv)
        for method, res in results.items():
            if res["status"] != "ok":
                print(f"{method}: {res['status']}: {res.get('reason', '')}")
            for dataset, data in res.get("datasets", {}).items():
                if data["status"] != "ok":
                    print(f"{method}/{dataset}: {data['status']}: {data.get('reason', '')}")
        rounds.append(build_rows(args, results))
    rows = median_rows(rounds)
    mode = "eager" if args.eager else "compiled"
    how = "greedy" if args.temperature == 0 else f"temperature {args.temperature:g}, top-p {args.top_p:g}"
    title = (
        f"{Path(model).name}, {args.dtype}, {mode}, {how}, concurrency {args.concurrency}, "
        f"{args.num_prompts} prompts x {tokens_label(args)};\n{runtime}"
    )
    print(f"\n{title}\n")
    print(markdown_table(rows))

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = run_stem(args)
    png, jsonl = out_dir / f"{stem}.png", out_dir / f"{stem}.jsonl"
    if save_chart(rows, args, png, title):
        print(f"\nchart: {png}")
    append_jsonl(jsonl, run_settings(args, model, runtime), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
