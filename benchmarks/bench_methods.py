"""Compare speculative methods in vLLM (offline `LLM`) on the same real prompts, in interleaved rounds.

    python benchmarks/bench_methods.py                      # none,ngram,suffix,lookahead x humaneval,sharegpt
    python benchmarks/bench_methods.py --eager --concurrency 16 --num-prompts 32 --max-tokens 96 \
        --range-ratio 0.5 --rounds 5 --methods none,suffix,lookahead

Each method's engine starts once, in a worker process of its own (this script with `--worker METHOD`), and stays up:
every round, each set's methods run one after another on the same prompts, in an order rotated by one each round,
so that a round's ratios compare runs well under a minute apart (a shared machine's speed drifts by 20% and more
over minutes). Between its turns a worker's processes, its engine's among them, are stopped (SIGSTOP), so that the
idle engines take no CPU from the one being timed. Every round takes the next `--num-prompts` prompts of each set:
methods that learn from earlier outputs (suffix decoding, lookahead's suffix trees) hold the earlier rounds' outputs
of other prompts, as a server that has run a while does, never the measured prompts' own. HumanEval's 164 problems
bound --rounds x --num-prompts. A method that crashes or is rejected becomes a `failed` / `skipped` row.

`--fresh-engines`: the mode before interleaving, for engines that must not share memory: each round starts every
method's engine afresh and closes it after its turn, on the same prompts every round.

Prints per set and method the median over rounds of its tokens/s over plain decoding's in the same round (with the
lowest and highest), tokens per forward, drafts a step and acceptance pooled over all rounds, and per round which
method was the fastest; saves a PNG and appends the rows (each with all its rounds) to a JSONL file named after the
settings. See benchmarks/README.md for the columns.
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

from vllm_lookahead.devtools import bench, server

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# Repetitive, so speculative methods draft and verify during warm-up; unrelated to the datasets, so methods that learn
# from earlier outputs (suffix) gain nothing on the measured prompts.
WARMUP_PROMPT = "Repeat: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat,"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default=bench.DEFAULT_METHODS, help=f"comma list from: {', '.join(bench.METHODS)}")
    p.add_argument("--datasets", default=",".join(bench.DATASETS), help="comma list from: " + ", ".join(bench.DATASETS))
    p.add_argument("--num-prompts", type=int, default=10, help="prompts per dataset and round")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt")
    p.add_argument(
        "--range-ratio",
        type=float,
        default=0.0,
        help="0: every prompt gets --max-tokens; R in (0, 1): prompt i gets a length drawn uniformly from "
        "[max_tokens * (1 - R), max_tokens * (1 + R)] (seeded: the same for every method), as vLLM's "
        "`vllm bench serve --random-range-ratio` varies output lengths. With one length for all, a batch's "
        "requests finish together and the next ones are admitted together, which favours plain decoding",
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
    p.add_argument("--model", default=None, help="a registered model name or a folder (default: the embedded model)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument(
        "--eager",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="enforce_eager (default: compiled; the first compiled start takes about 80 s, cached after)",
    )
    p.add_argument("--lookahead-config", default=None, help="JSON merged into every lookahead method's config")
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
        help="rounds of every method (order rotated by one a round); each cell is the round with the median ratio to "
        "that round's none (the lower middle one for an even number)",
    )
    p.add_argument(
        "--fresh-engines",
        action="store_true",
        help="start each method's engine afresh every round, alone in memory, on the same prompts every round",
    )
    p.add_argument("--out", default=bench.RESULTS, help="folder for the PNG and the JSONL")
    # Internal: a method's live worker and the file its results go to.
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.method_list = [m.strip() for m in args.methods.split(",") if m.strip()]
    args.dataset_list = [d.strip() for d in args.datasets.split(",") if d.strip()]
    for m in args.method_list:
        if m not in bench.METHODS:
            p.error(f"unknown method '{m}'; known: {', '.join(bench.METHODS)}")
    for d in args.dataset_list:
        if d not in bench.DATASETS:
            p.error(f"unknown dataset '{d}'; known: {', '.join(bench.DATASETS)}")
    if min(args.concurrency, args.num_prompts, args.max_tokens, args.rounds) < 1:
        p.error("--concurrency, --num-prompts, --max-tokens and --rounds must be positive")
    if not 0 <= args.range_ratio < 1:
        p.error("--range-ratio must be in [0, 1)")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        p.error("--temperature must be >= 0 and --top-p in (0, 1]")
    bench.check_lookahead_config(p, args.lookahead_config)
    taken = args.num_prompts * (1 if args.fresh_engines else args.rounds)
    if "humaneval" in args.dataset_list and taken > bench.HUMANEVAL_SIZE:
        p.error(f"--rounds x --num-prompts is {taken}: HumanEval has {bench.HUMANEVAL_SIZE} prompts, and every round "
                "takes new ones")  # fmt: skip
    return args


def prompt_round(args: argparse.Namespace, r: int) -> int:
    """Whose prompts round r takes: its own (interleaved), or the first round's (fresh engines)."""
    return 0 if args.fresh_engines else r


# ----------------------------------------------------------------------------------------------- worker side


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
    before = bench.spec_counters(llm)
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
            per_prompt.append({"prompt_tokens": len(out.prompt_token_ids), "output_tokens": len(token_ids[-1]),
                               "time_s": dt})  # fmt: skip
    else:
        print(f"{label}: {len(prompts)} prompts at once", file=sys.stderr)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=True)
        elapsed = time.perf_counter() - t0
        for out in outs:
            token_ids.append(list(out.outputs[0].token_ids))
            per_prompt.append({"prompt_tokens": len(out.prompt_token_ids), "output_tokens": len(token_ids[-1])})
    spec = bench.counters_since(before, bench.spec_counters(llm))
    return {
        "status": "ok",
        "output_tokens": sum(p["output_tokens"] for p in per_prompt),
        "time_s": elapsed,
        "spec": spec,
        "per_prompt": per_prompt,
        "token_ids": token_ids,
    }


def start_engine(method: str, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The method's warmed-up engine and its result so far (status, spec_config); the engine is None when the method
    is skipped or its engine did not start (the result says why)."""
    os.environ.update(bench.method_environment(method, sampled=args.temperature > 0))
    result: dict[str, Any] = {"method": method, "spec_config": bench.speculative_config(method, args.lookahead_config)}
    if method in bench.REQUIRES:
        module, how = bench.REQUIRES[method]
        if importlib.util.find_spec(module) is None:
            return None, {**result, "status": "skipped", "reason": f"{module} is not installed ({how})"}

    from vllm import LLM, SamplingParams

    try:
        llm = LLM(
            model=bench.model_path(args.model),
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            max_num_seqs=args.concurrency,
            seed=0,
            enforce_eager=args.eager,
            disable_log_stats=False,  # get_metrics() needs the stat loggers
            speculative_config=result["spec_config"],
            **bench.engine_options(method),
        )
    except Exception as e:  # report it and go on with the other methods
        text = bench.one_line(e)
        rejected = method != "none" and ("speculative" in text.lower() or method in text.lower())
        if rejected:
            return None, {**result, "status": "skipped", "reason": f"engine rejected it: {text}"}
        return None, {**result, "status": "failed", "reason": f"engine did not start: {text}"}
    # Warm up in the measured mode: N concurrent requests when --concurrency N.
    llm.generate([WARMUP_PROMPT] * args.concurrency, SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False)
    return llm, {**result, "status": "ok"}


def measure(llm: Any, method: str, dataset: str, prompts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """One dataset's run (`run_dataset`), a failure reported as its status, with lookahead's worker counters."""
    try:
        data = run_dataset(llm, prompts, args, f"{method}/{dataset}")
    except Exception as e:
        data = {"status": "failed", "reason": bench.one_line(e)}
    if method.startswith("lookahead"):
        # the worker's counters after this dataset: the step-cost fit its sizing used, acceptance per source
        data["lookahead_stats"] = llm.collective_rpc("lookahead_stats")[0]
    return data


def serve(args: argparse.Namespace) -> int:
    """A live worker: start the method's engine, write its start result to --result-file, then run one command a line
    from stdin ("ROUND DATASET": that round's prompts of the set, the result written to <result-file>.ROUND.DATASET)
    until stdin ends."""
    llm, result = start_engine(args.worker, args)
    bench.write_json_atomic(Path(args.result_file), result)
    if llm is None:
        return 0
    tokenizer = llm.get_tokenizer()
    while line := sys.stdin.readline():
        round_index, dataset = line.split()
        r, n = int(round_index), args.num_prompts
        prompts = bench.set_prompts(dataset, (prompt_round(args, r) + 1) * n, tokenizer)[prompt_round(args, r) * n :]
        bench.write_json_atomic(
            Path(f"{args.result_file}.{r}.{dataset}"), measure(llm, args.worker, dataset, prompts, args)
        )
    return 0


# ------------------------------------------------------------------------------------------------- main side


class LiveWorker:
    """One method's worker process: started once, then asked for one (round, dataset) run at a time; its processes
    stopped between turns."""

    def __init__(self, method: str, argv: list[str], folder: Path, cmd: list[str] | None = None) -> None:
        self.method = method
        self.base = folder / f"{method}.json"
        for old in folder.glob(f"{method}.json*"):  # a fresh engine of an earlier round left its files
            old.unlink()
        script = [sys.executable, os.path.abspath(__file__), *argv]
        cmd = [*(cmd or script), "--worker", method, "--result-file", str(self.base)]
        # A process group of its own: its engine's processes are stopped, resumed and killed with it.
        self.proc = server.spawn(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.tail = bytearray()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()
        # the start's result (status, spec_config); `result` then follows the worker's state
        self.start = self._wait(self.base) or {"method": method, "status": "failed", "reason": self._died()}
        self.result = self.start
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Lets the worker's processes run again (they are stopped between turns)."""
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        """To the worker's process group: its engine's processes too (they inherit it; the worker leads its own)."""
        server.signal_group(self.proc, sig)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        while chunk := self.proc.stdout.read1(65536):
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
            self.tail.extend(chunk)
            del self.tail[:-4000]

    def _wait(self, path: Path) -> dict[str, Any] | None:
        while not path.exists():
            if self.proc.poll() is not None:
                return None
            time.sleep(0.1)
        return json.loads(path.read_text())

    def _died(self) -> str:
        rc = self.proc.wait()
        lines = [line for line in bytes(self.tail).decode(errors="replace").replace("\r", "\n").splitlines() if line]
        how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
        return f"worker {how}" + (f"; its last output: {lines[-1].strip()[:300]}" if lines else "")

    @property
    def live(self) -> bool:
        return self.result["status"] == "ok" and self.proc.poll() is None

    def run(self, round_index: int, dataset: str) -> dict[str, Any]:
        if not self.live:
            return {"status": "failed", "reason": self.result.get("reason", "worker not running")}
        assert self.proc.stdin is not None
        self.resume()
        self.proc.stdin.write(f"{round_index} {dataset}\n".encode())
        self.proc.stdin.flush()
        data = self._wait(Path(f"{self.base}.{round_index}.{dataset}"))
        self._signal(signal.SIGSTOP)
        if data is None:
            self.result = {**self.result, "status": "failed", "reason": self._died()}
            return {"status": "failed", "reason": self.result["reason"]}
        return data

    def close(self) -> None:
        self.resume()
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            pass
        finally:
            server.stop(self.proc)
            self._reader.join(timeout=10)


run_order = bench.run_order


def run_rounds(
    args: argparse.Namespace, argv: list[str], folder: Path, cmd: list[str] | None = None
) -> list[dict[str, dict[str, Any]]]:
    """Every round's results per method ({method: start result with "datasets": {set: data}}), interleaved (the
    engines started once) or with fresh engines (started and closed in each method's turn). `cmd`: the workers'
    command (default: this script)."""
    workers: dict[str, LiveWorker] = {}
    rounds: list[dict[str, dict[str, Any]]] = []

    def start(method: str) -> LiveWorker:
        print(f"=== starting {method} ===", file=sys.stderr)
        w = workers[method] = LiveWorker(method, argv, folder, cmd)
        if w.start["status"] != "ok":
            print(f"{method}: {w.start['status']}: {w.start.get('reason', '')}")
        return w

    try:
        if not args.fresh_engines:
            for method in args.method_list:  # one at a time: engines start faster alone
                start(method)
        for r in range(args.rounds):
            datasets: dict[str, dict[str, Any]] = {m: {} for m in args.method_list}
            starts: dict[str, dict[str, Any]] = {}
            turns = (
                [(m, args.dataset_list) for m in run_order(args.method_list, r)]
                if args.fresh_engines
                else [(m, [d]) for d in args.dataset_list for m in run_order(args.method_list, r)]
            )
            for method, sets in turns:
                w = start(method) if args.fresh_engines else workers[method]
                for dataset in sets:
                    print(f"=== {method}/{dataset} (round {r + 1} of {args.rounds}) ===", file=sys.stderr)
                    datasets[method][dataset] = data = w.run(r, dataset)
                    if data["status"] != "ok" and w.start["status"] == "ok":
                        print(f"{method}/{dataset}: {data['status']}: {data.get('reason', '')}")
                starts[method] = w.start
                if args.fresh_engines:
                    w.close()
            rounds.append({m: {**s, "datasets": datasets[m]} if s["status"] == "ok" else s for m, s in starts.items()})
    finally:
        for w in workers.values():  # all resumed first: a stopped worker would outlive an error in a close
            w.resume()
        for w in workers.values():
            try:
                w.close()
            except Exception as e:  # the others still close
                print(f"{w.method}: closing its worker failed: {e}", file=sys.stderr)
    return rounds


def build_rows(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One round's rows, one per (dataset, method), each against the round's plain decoding (`none`)."""
    rows: list[dict[str, Any]] = []
    for dataset in args.dataset_list:
        base = results.get("none", {}).get("datasets", {}).get(dataset, {})
        base_ok = base.get("status") == "ok"
        for method in args.method_list:
            res = results[method]
            data = res.get("datasets", {}).get(dataset) if res["status"] == "ok" else None
            row: dict[str, Any] = {"dataset": dataset, "method": method, "spec_config": res.get("spec_config")}
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
    prompts, while each method's median round may be another round, with other prompts."""
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


def fastest(rows: list[dict[str, Any]], datasets: list[str]) -> dict[str, str]:
    """Per dataset, the method with the most tokens/s in one round's rows."""
    out = {}
    for d in datasets:
        ok = [r for r in rows if r["dataset"] == d and r["status"] == "ok"]
        if ok:
            out[d] = max(ok, key=lambda r: r["tokens_per_s"])["method"]
    return out


def fmt(value: Any, spec: str) -> str:
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
                fmt(r.get("vs_none"), ".2f") + _spread(r.get("vs_none_rounds")),
                f"{r['tokens_per_forward']:.2f}",
                f"{r['drafts_per_step']:.1f}",
                fmt(r["acceptance"], ".2f"),
                _per_pos(r["accepted_per_pos"]),
                identical,
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def save_chart(rows: list[dict[str, Any]], rounds: list[list[dict[str, Any]]], args: argparse.Namespace, path: Path,
               title: str) -> bool:  # fmt: skip
    """Left: each method's tokens/s over plain decoding's (the median round, a bar per set), with every round's as
    dots; right: tokens per target forward (pooled)."""
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
            xs, ys, dots = [], [], []
            for i, dataset in enumerate(args.dataset_list):
                x = i + (j - (len(methods) - 1) / 2) * width
                for r in ok:
                    if r["dataset"] == dataset and r["method"] == method and r.get(key) is not None:
                        xs.append(x)
                        ys.append(r[key])
                        if key == "vs_none" and len(rounds) > 1:
                            dots += [(x, v) for v in r.get("vs_none_rounds", []) if v is not None]
            bars = ax.bar(xs, ys, width, label=method)
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
            if dots:
                ax.plot(*zip(*dots, strict=True), "k.", markersize=3)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(args.dataset_list)), args.dataset_list)
        ax.set_ylabel(label)
        ax.set_title(label + (" (median round; dots: every round)" if key == "vs_none" and len(rounds) > 1 else ""))
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(methods), frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def run_stem(args: argparse.Namespace) -> str:
    """A result's file name: the methods, sets and settings, the rounds, and the mode if not interleaved."""
    return (
        f"methods_{'-'.join(args.method_list)}_{'-'.join(args.dataset_list)}_{args.dtype}"
        f"_{'eager' if args.eager else 'compiled'}_c{args.concurrency}_n{args.num_prompts}_t{args.max_tokens}"
        + (f"_r{args.range_ratio:g}" if args.range_ratio > 0 else "")
        + (f"_T{args.temperature:g}_p{args.top_p:g}" if args.temperature > 0 else "")
        + ("_vllm-runtime" if args.runtime == "vllm" else "")
        + ("_tree-kernel-off" if os.environ.get("VLLM_LOOKAHEAD_TREE_KERNEL") == "0" else "")
        + f"_R{args.rounds}"
        + ("_fresh" if args.fresh_engines else "")
    )


def run_settings(args: argparse.Namespace, model: str, runtime: str) -> dict[str, Any]:
    """The settings a results JSONL line records beside its rows."""
    keys = ("dtype", "eager", "concurrency", "num_prompts", "max_tokens", "range_ratio", "temperature", "top_p",
            "rounds", "fresh_engines", "max_model_len")  # fmt: skip
    return {"model": model, **{k: getattr(args, k) for k in keys}, "runtime": runtime, "cpu_count": os.cpu_count()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return serve(args)
    model = bench.model_path(args.model)  # prepared once, before the workers need it
    runtime = bench.apply_runtime(args.runtime)
    # SIGTERM (e.g. `timeout`) ends through run_rounds' cleanup, which resumes and closes the stopped workers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="bench-methods-") as tmp:
        results = run_rounds(args, argv, Path(tmp))
    rounds = [build_rows(args, res) for res in results]
    winners = [fastest(rows, args.dataset_list) for rows in rounds]
    rows = median_rows(rounds)
    mode = "eager" if args.eager else "compiled"
    how = "greedy" if args.temperature == 0 else f"temperature {args.temperature:g}, top-p {args.top_p:g}"
    interleaving = "fresh engines" if args.fresh_engines else "interleaved"
    title = (
        f"{Path(model).name}, {args.dtype}, {mode}, {how}, concurrency {args.concurrency}, {interleaving}, "
        f"{args.rounds} round(s) of {args.num_prompts} prompts x {tokens_label(args)};\n{runtime}"
    )
    print(f"\n{title}\n")
    print(markdown_table(rows))
    if args.rounds > 1:
        print()
        for dataset in args.dataset_list:
            order = [w.get(dataset, "-") for w in winners]
            counts = ", ".join(f"{m} {order.count(m)}" for m in args.method_list if m in order)
            print(f"{dataset}: fastest by round: {', '.join(order)} ({counts})")
    for row in rows:
        row["fastest_by_round"] = [w.get(row["dataset"]) for w in winners]
    out_dir = Path(args.out)
    stem = run_stem(args)
    png, jsonl = out_dir / f"{stem}.png", out_dir / f"{stem}.jsonl"
    if save_chart(rows, rounds, args, png, title):
        print(f"\nchart: {png}")
    bench.append_jsonl(jsonl, run_settings(args, model, runtime), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
