"""Speculative methods against the batch size: tokens/s vs plain decoding, and the tree size lookahead chooses.

    python benchmarks/bench_batch.py                                  # concurrency 1,4,16; humaneval,sharegpt
    python benchmarks/bench_batch.py --concurrency 1,16 --methods none,suffix,lookahead --num-prompts 16 --eager

For each concurrency C it runs `bench_methods.py` (interleaved rounds, `max_num_seqs=C`, C requests in flight) on
max(C, --num-prompts) prompts per dataset, then prints one table and saves one PNG: tokens/s relative to plain
decoding per method, and lookahead's draft tokens per request-step (the tree size its sizing chose) against C. For
lookahead the table also gives the step-cost fit its sizing ended the run with and the bar a request's first node had
to clear at C requests. Other options (`--dtype`, `--max-tokens`, `--eager`, `--rounds`, `--lookahead-config`, ...)
pass through to bench_methods.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from vllm_lookahead.devtools import bench

BENCH_METHODS = Path(__file__).resolve().with_name("bench_methods.py")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This script's options, and the rest (bench_methods.py's)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,4,16", help="comma list of concurrent requests")
    p.add_argument("--num-prompts", type=int, default=8, help="prompts per dataset (at least the concurrency)")
    p.add_argument("--methods", default=bench.DEFAULT_METHODS)
    p.add_argument("--out", default=bench.RESULTS)
    args, rest = p.parse_known_args(argv)
    try:
        args.levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        p.error("--concurrency: positive integers")
    if not args.levels or min(args.levels) < 1:
        p.error("--concurrency: positive integers")
    return args, rest


def run_level(args: argparse.Namespace, rest: list[str], c: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """bench_methods.py's rows at concurrency c (its table and logs go to stderr), and the settings it recorded."""
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        n = max(c, args.num_prompts)
        cmd = [sys.executable, str(BENCH_METHODS), *rest, "--methods", args.methods, "--concurrency", str(c),
               "--num-prompts", str(n), "--out", tmp]  # fmt: skip
        print(f"=== concurrency {c} ===", file=sys.stderr)
        rc = subprocess.run(cmd, stdout=sys.stderr).returncode
        found = list(Path(tmp).glob("*.jsonl"))
        if rc != 0 or not found:
            raise SystemExit(f"bench_methods.py failed at concurrency {c} (exit {rc})")
        lines = [json.loads(line) for line in found[0].read_text().splitlines()]
    settings = lines[0]["settings"]
    rows = [{k: v for k, v in line.items() if k not in ("time", "settings")} | {"concurrency": c} for line in lines]
    return rows, settings


def step_cost(r: dict[str, Any]) -> tuple[str, float] | None:
    """Lookahead's step prices at the end of the row's run (ms at 1, 8 and 64 tokens, one request: `StepCost.summary`)
    and the bar a node's score had to clear at this concurrency C on that curve (`sizing.score_floor`)."""
    stats = r.get("lookahead_stats")
    if not stats or "step_cost_t1" not in stats:
        return None
    from vllm_lookahead.core.cost import SUMMARY_TOKENS, StepCost
    from vllm_lookahead.core.sizing import score_floor

    cost = StepCost.fixed(SUMMARY_TOKENS, [stats[f"step_cost_t{t}"] for t in SUMMARY_TOKENS])
    prices = " / ".join(f"{1e3 * stats[f'step_cost_t{t}']:.1f}" for t in (1, 8, 64))
    return prices, score_floor(cost, r["concurrency"])


def table(rows: list[dict[str, Any]]) -> str:
    head = ["dataset", "concurrency", "method", "tokens/s", "vs none", "tokens/forward", "drafts/step", "identical",
            "step ms at 1 / 8 / 64 tokens", "bar for a node"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['dataset']} | {r['concurrency']} | {r['method']} | {r.get('status')} |" + " |" * 6)
            continue
        ident = f"{r['identical']}/{r['prompts']}" if "identical" in r else "n/a"
        cost = step_cost(r)
        vs_none = "n/a" if r.get("vs_none") is None else f"{r['vs_none']:.2f}"
        lines.append(
            f"| {r['dataset']} | {r['concurrency']} | {r['method']} | {r['tokens_per_s']:.1f} | {vs_none} | "
            f"{r['tokens_per_forward']:.2f} | {r['drafts_per_step']:.1f} | {ident} | "
            f"{'' if cost is None else cost[0]} | {'' if cost is None else f'{cost[1]:.2f}'} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("status") == "ok"]
    datasets = sorted({r["dataset"] for r in ok})
    methods = list(dict.fromkeys(r["method"] for r in ok))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ds, style in zip(datasets, ("-", "--", ":"), strict=False):
        for m in methods:
            pts = sorted((r["concurrency"], r.get("vs_none")) for r in ok if r["dataset"] == ds and r["method"] == m)
            if m != "none" and pts:
                axes[0].plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=f"{m} ({ds})")
        la = sorted(
            (r["concurrency"], r["drafts_per_step"]) for r in ok if r["dataset"] == ds and r["method"] == "lookahead"
        )
        if la:
            axes[1].plot([p[0] for p in la], [p[1] for p in la], style, marker="o", label=ds)
    axes[0].axhline(1.0, color="gray", lw=1)
    axes[0].set_ylabel("tokens/s vs plain decoding")
    axes[1].set_ylabel("lookahead draft tokens per request-step")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, rest = parse_args(argv)
    rows: list[dict[str, Any]] = []
    settings: dict[str, Any] = {}
    for c in args.levels:
        level, settings = run_level(args, rest, c)
        rows += level
    mode = "eager" if settings["eager"] else "compiled"
    title = f"{settings['dtype']}, {mode}, {settings['max_tokens']} tokens per request\n{settings['runtime']}"
    print(f"\n{title}\n\n{table(rows)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"batch_{args.methods.replace(',', '-')}_c{'-'.join(map(str, args.levels))}_{settings['dtype']}"
    plot(rows, out / f"{stem}.png", title)
    print(f"\nchart: {out / f'{stem}.png'}")
    bench.append_jsonl(out / f"{stem}.jsonl", {"argv": argv, **settings}, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
