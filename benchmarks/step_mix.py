"""Where a batch run's time goes by kind of engine step: decode-only steps against steps that also prefill.

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/step_mix.py --dataset sharegpt --concurrency 16
    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/step_mix.py --methods none,suffix,lookahead

Each method runs in a process of its own, its engine in that process (VLLM_ENABLE_V1_MULTIPROCESSING=0), with
max_num_seqs = --concurrency, eager, greedy, on HumanEval or chat-templated ShareGPT prompts as bench_methods feeds
them, after a short warm-up on two of them. Every scheduler step is recorded (requests, draft tokens, prefill
tokens: those beyond one token and the drafts per request) and timed to the next one. Prints per method: tokens/s,
engine steps, the decode-only steps (their time, request-steps, drafts, ms per step and per request-step) and the
steps that also prefill (their time and prefill tokens), and a least-squares fit over all steps of a step's time to
its requests, drafts and prefill tokens (ms). A speculative method makes fewer request-steps; how much of that shows
in tokens/s depends on how full its batches stay and what its steps cost, which this table shows. A second table
splits a step's time by the model runner's phases (timed around its methods): the forward, the rest of running the
model (inputs, logits), sampling and verification, and drafting the next step's drafts. A third splits the decode-only
steps by the draft tokens they computed (median ms and count per draft count): where a step's cost starts to grow
with its tokens (on this CPU at batch 1, past about 6 tokens), the knee `sizing.StepCost` fits; the same is drawn
in `--out`/step_mix_<dataset>_<dtype>_c<concurrency>.png.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _inprocess import add_common_args  # the scripts run from benchmarks/, which is on sys.path
from _inprocess import engine as in_process_engine
from _inprocess import prompts as set_prompts
from bench_methods import output_lengths, tokens_label

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="none,lookahead", help="comma list from: none, ngram, suffix, lookahead")
    add_common_args(p, dtype="float32", dataset="sharegpt", num_prompts=48, max_tokens=96)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--range-ratio", type=float, default=0.0, help="output lengths varied as bench_methods' --range-ratio"
    )
    p.add_argument("--out", default=str(RESULTS), help="folder of the plot of step time by draft tokens")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from bench_methods import METHODS

    args.method_list = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in args.method_list if m not in ("none", "ngram", "suffix", "lookahead")]
    if bad or not args.method_list:
        p.error(f"--methods: unknown {bad}; choose from none, ngram, suffix, lookahead")
    if not 0 <= args.range_ratio < 1:
        p.error("--range-ratio must be in [0, 1)")
    if min(args.concurrency, args.num_prompts, args.max_tokens) < 1:
        p.error("--concurrency, --num-prompts and --max-tokens must be positive")
    args.configs = METHODS
    return args


def worker(args: argparse.Namespace) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler

    records: list[tuple[float, int, int, int]] = []
    original = Scheduler.schedule

    def schedule(self: Scheduler, *a: Any, **k: Any) -> Any:
        out = original(self, *a, **k)
        drafts = sum(len(v) for v in out.scheduled_spec_decode_tokens.values())
        requests = len(out.num_scheduled_tokens)
        records.append((time.perf_counter(), requests, drafts, out.total_num_scheduled_tokens - requests - drafts))
        return out

    Scheduler.schedule = schedule  # this process's engine only: the script's own measurement
    llm = in_process_engine(args, args.concurrency, args.configs[args.worker])
    phases = time_phases()  # after the engine exists: around the plugin's patches, where a method has them
    prompts = set_prompts(llm, args.dataset, args.num_prompts + 2)
    llm.generate(prompts[-2:], SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)
    records.clear()
    phases.update(dict.fromkeys(phases, 0.0))
    start = time.perf_counter()
    lengths = output_lengths(args, len(prompts) - 2)
    params = [SamplingParams(max_tokens=n, temperature=0) for n in lengths]
    outs = llm.generate(prompts[:-2], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    records.append((time.perf_counter(), 0, 0, 0))
    steps = [(records[i + 1][0] - records[i][0], *records[i][1:]) for i in range(len(records) - 1) if records[i][1]]
    decode = [s for s in steps if s[3] == 0]
    mixed = [s for s in steps if s[3] > 0]
    forward, execute, sample, draft = (phases[k] for k in PHASES)
    return {
        "phases_s": {
            "forward": forward,
            "inputs and logits": execute - forward,
            "sampling and verification": sample - draft,
            "drafting": draft,
        },
        "fit_ms": step_fit(steps),
        "method": args.worker,
        "seconds": seconds,
        "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
        "steps": len(steps),
        "decode_steps": len(decode),
        "decode_s": sum(s[0] for s in decode),
        "decode_request_steps": sum(s[1] for s in decode),
        "decode_drafts": sum(s[2] for s in decode),
        "by_drafts": by_drafts(decode),
        "mixed_steps": len(mixed),
        "mixed_s": sum(s[0] for s in mixed),
        "mixed_request_steps": sum(s[1] for s in mixed),
        "prefill_tokens": sum(s[3] for s in mixed),
    }


# The model runner's methods timed, outermost last: a step's forward, the rest of `execute_model` (inputs, logits),
# `sample_tokens` (sampling, verification) and, called from it, the drafting of the next step's drafts.
PHASES = ("_model_forward", "execute_model", "sample_tokens", "propose_draft_token_ids")


def time_phases() -> dict[str, float]:
    """Seconds spent in each of PHASES, summed over the run (the caller may zero its values)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    spent = dict.fromkeys(PHASES, 0.0)

    def timed(name: str, fn: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t

        return run

    for name in PHASES:
        setattr(GPUModelRunner, name, timed(name, getattr(GPUModelRunner, name)))
    return spent


def by_drafts(steps: list[tuple[float, int, int, int]]) -> dict[int, tuple[float, int]]:
    """Steps (seconds, requests, drafts, prefill tokens) by their draft tokens: median ms and count."""
    import numpy as np

    out: dict[int, tuple[float, int]] = {}
    for d in sorted({s[2] for s in steps}):
        t = [s[0] for s in steps if s[2] == d]
        out[d] = (round(float(np.median(t)) * 1e3, 2), len(t))
    return out


# Draft-count columns of the table: single counts, then wider ranges.
DRAFT_BINS = ((0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6), (7, 8), (9, 12), (13, 16), (17, 24), (25, 10**9))


def drafts_table(rows: list[dict[str, Any]]) -> str:
    """Decode-only steps' median ms by draft tokens (count in brackets; a range's median over its steps' medians,
    weighted by their counts, the lower middle one)."""
    names = [f"{a}" if a == b else (f"{a}+" if b > 10**8 else f"{a}-{b}") for a, b in DRAFT_BINS]
    lines = ["| method | " + " | ".join(f"{n} drafts" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for r in rows:
        cells = []
        for a, b in DRAFT_BINS:
            got = [(ms, n) for d, (ms, n) in r["by_drafts"].items() if a <= int(d) <= b]
            count = sum(n for _, n in got)
            if not count:
                cells.append("")
                continue
            flat = sorted(ms for ms, n in got for _ in range(n))
            cells.append(f"{flat[(len(flat) - 1) // 2]:.1f} ({count})")
        lines.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Median step time against draft tokens per method, each point's area by its number of steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        pts = sorted((int(d), ms, n) for d, (ms, n) in r["by_drafts"].items())
        if not pts:
            continue
        xs, ys, ns = zip(*pts, strict=True)
        line = ax.plot(xs, ys, alpha=0.5)[0]
        ax.scatter(xs, ys, s=[8 + 200 * n / max(ns) for n in ns], color=line.get_color(), label=r["method"])
    ax.set_xlabel("draft tokens in the step")
    ax.set_ylabel("decode-only step, median ms")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def step_fit(steps: list[tuple[float, int, int, int]]) -> list[float]:
    """Least squares over every step: seconds = fixed + per_request * R + per_draft * D + per_prefill_token * P,
    in ms (a count that never varies, e.g. the requests at batch 1, is folded into the fixed cost and shows 0). A
    method's fixed cost against plain decoding's is what speculating costs a step besides its tokens."""
    import numpy as np

    a = np.array(steps, dtype=float).reshape(-1, 4)
    x = np.column_stack([np.ones(len(a)), a[:, 1], a[:, 2], a[:, 3]])
    for j in (1, 2, 3):
        if np.ptp(x[:, j]) == 0:  # e.g. no drafts, or one request at a time: folded into the fixed cost
            x[:, j] = 0.0
    coef = np.linalg.lstsq(x, a[:, 0], rcond=None)[0]
    return [round(float(c) * 1e3, 3) for c in coef]


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| method | tokens/s | steps | decode-only steps | their s | request-steps | drafts | ms/step "
        "| ms/request-step | steps with prefill | their s | prefill tokens "
        "| fit: ms a step + a request + a draft + a prefill token |\n" + "|---" * 13 + "|"
    )
    lines = [head]
    for r in rows:
        d = max(r["decode_steps"], 1)
        lines.append(
            f"| {r['method']} | {r['tokens'] / r['seconds']:.1f} | {r['steps']} | {r['decode_steps']} "
            f"| {r['decode_s']:.1f} | {r['decode_request_steps']} | {r['decode_drafts']} "
            f"| {r['decode_s'] / d * 1e3:.0f} | {r['decode_s'] / max(r['decode_request_steps'], 1) * 1e3:.1f} "
            f"| {r['mixed_steps']} | {r['mixed_s']:.1f} | {r['prefill_tokens']} "
            f"| {' + '.join(f'{c:.2f}' for c in r['fit_ms'])} |"
        )
    return "\n".join(lines)


def phase_table(rows: list[dict[str, Any]]) -> str:
    names = list(rows[0]["phases_s"])
    lines = ["| method | " + " | ".join(f"{n}, ms a step" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for r in rows:
        cells = " | ".join(f"{r['phases_s'][n] / max(r['steps'], 1) * 1e3:.2f}" for n in names)
        lines.append(f"| {r['method']} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print("STEP_MIX " + json.dumps(worker(args)), flush=True)
        return 0
    rows = []
    for method in args.method_list:
        print(f"=== {method} ===", flush=True)
        cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--worker", method]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = [ln for ln in proc.stdout.splitlines() if ln.startswith("STEP_MIX ")]
        if proc.returncode or not found:
            print(proc.stdout[-2000:] + proc.stderr[-3000:], file=sys.stderr)
            return 1
        rows.append(json.loads(found[-1].removeprefix("STEP_MIX ")))
    print(
        f"\n### {args.dataset}, {args.dtype}, {args.concurrency} at a time, {args.num_prompts} prompts x "
        f"{tokens_label(args)}\n"
    )
    print(table(rows))
    print()
    print(phase_table(rows))
    print()
    print(drafts_table(rows))
    path = Path(args.out) / f"step_mix_{args.dataset}_{args.dtype}_c{args.concurrency}.png"
    plot(rows, path, f"{args.dataset}, {args.dtype}, {args.concurrency} at a time: step time by draft tokens")
    print(f"\nplot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
