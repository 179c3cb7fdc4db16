"""Precision: how often greedy outputs diverge from float32 plain decoding, at which token, and whether lookahead
diverges more or less than plain decoding in the same precision.

    python benchmarks/bench_precision.py                    # 60 HumanEval + 60 ShareGPT prompts x 64 tokens
    python benchmarks/bench_precision.py --model qwen2.5-coder-0.5b-instruct --num-prompts 40

Four engines, one after another, on the same prompts, greedy: plain decoding and lookahead (its defaults), each in
float32 and bfloat16. Float32 plain decoding is the reference; it also returns its top-2 logprobs at every position,
so that each divergence can be placed against the reference's margin between its best and second-best token there
(a near-tie flips on the smallest change of arithmetic). Prints a table and saves a PNG (where outputs first
diverge, and the reference's margin there) plus a JSONL. Runs under the project's CPU runtime when started by
`make`-style commands (`python -m vllm_lookahead.tools.cpu_runtime run -- ...`); the runtime does not change the answer.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from vllm_lookahead.devtools.bench import RESULTS, append_jsonl

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

CONFIGS = (("plain", "float32"), ("lookahead", "float32"), ("plain", "bfloat16"), ("lookahead", "bfloat16"))
NEAR_TIE = 0.1  # nats between the reference's best and second-best token


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a registered model name (tools.models); default: embedded")
    p.add_argument("--num-prompts", type=int, default=120, help="half HumanEval, half ShareGPT")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16, help="max_num_seqs of every engine")
    p.add_argument("--out", default=RESULTS)
    args = p.parse_args(argv)
    if args.num_prompts < 2 or args.max_tokens < 1:
        p.error("--num-prompts >= 2 and --max-tokens >= 1")
    return args


def load(args: argparse.Namespace) -> tuple[str, list[str]]:
    from transformers import AutoTokenizer

    from vllm_lookahead.devtools import models
    from vllm_lookahead.devtools.prompts import as_chat, humaneval_prompts, sharegpt_prompts

    path = str(models.prepare(args.model)) if args.model else models.default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    half = args.num_prompts // 2
    chat = [as_chat(tok, p) for p in sharegpt_prompts(args.num_prompts - half, max_chars=1200)]
    return path, [*humaneval_prompts(half), *chat]


def generate(path: str, prompts: list[str], method: str, dtype: str, args: argparse.Namespace, logprobs: bool):
    """Each prompt's tokens, and (with logprobs) each position's top-2 margin in nats."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=path,
        dtype=dtype,
        max_model_len=2048,
        max_num_seqs=args.concurrency,
        enforce_eager=True,
        seed=0,
        speculative_config={"method": "lookahead"} if method == "lookahead" else None,
    )
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=2 if logprobs else None)
    try:
        outs = llm.generate(prompts, sp, use_tqdm=True)
    finally:
        del llm
        gc.collect()
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    margins = []
    if logprobs:
        for o in outs:
            row = []
            for pos in o.outputs[0].logprobs or []:
                top = sorted((lp.logprob for lp in pos.values()), reverse=True)
                row.append(top[0] - top[1] if len(top) > 1 else float("inf"))
            margins.append(row)
    return tokens, margins


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where two outputs differ (the shorter one's end if one is a prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def analyse(outputs: dict[tuple[str, str], list[list[int]]], margins: list[list[float]]) -> list[dict[str, Any]]:
    ref = outputs[("plain", "float32")]
    all_margins = [m for row in margins for m in row]
    rows = []
    for method, dtype in CONFIGS:
        got = outputs[(method, dtype)]
        same_dtype = outputs[("plain", dtype)]
        div = [first_divergence(g, r) for g, r in zip(got, ref, strict=True)]
        at = [(i, d) for i, d in enumerate(div) if d is not None]
        gaps = [margins[i][d] for i, d in at if d < len(margins[i])]
        rows.append(
            {
                "method": method,
                "dtype": dtype,
                "prompts": len(ref),
                "identical_to_fp32_plain": len(ref) - len(at),
                "identical_to_plain_same_dtype": sum(g == s for g, s in zip(got, same_dtype, strict=True)),
                "first_divergence": [d for _, d in at],
                "median_first_divergence": statistics.median([d for _, d in at]) if at else None,
                "margins_at_divergence": gaps,
                "near_ties_at_divergence": sum(g < NEAR_TIE for g in gaps),
                "near_tie_share_all_positions": sum(m < NEAR_TIE for m in all_margins) / max(1, len(all_margins)),
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = [
        "method",
        "dtype",
        "identical to float32 plain",
        "identical to plain, same dtype",
        "median first divergence (token)",
        f"reference margin < {NEAR_TIE} nats at the divergence",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        n = r["prompts"]
        med = "-" if r["median_first_divergence"] is None else f"{r['median_first_divergence']:.0f}"
        gaps = r["margins_at_divergence"]
        ties = f"{r['near_ties_at_divergence']}/{len(gaps)}" if gaps else "-"
        lines.append(
            f"| {r['method']} | {r['dtype']} | {r['identical_to_fp32_plain']}/{n} | "
            f"{r['identical_to_plain_same_dtype']}/{n} | {med} | {ties} |"
        )
    share = rows[0]["near_tie_share_all_positions"]
    lines.append(f"\n(Of all the reference's positions, {100 * share:.1f}% have a margin under {NEAR_TIE} nats.)")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], max_tokens: int, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in rows[1:]:
        div = sorted(r["first_divergence"])
        n = r["prompts"]
        xs = list(range(max_tokens + 1))
        axes[0].plot(xs, [sum(d <= x for d in div) / n for x in xs], label=f"{r['method']} {r['dtype']}")
        if r["margins_at_divergence"]:
            axes[1].hist(
                [min(g, 5.0) for g in r["margins_at_divergence"]],
                bins=25,
                range=(0, 5),
                alpha=0.5,
                label=f"{r['method']} {r['dtype']}",
            )
    axes[0].set(xlabel="generated token", ylabel="share of prompts diverged", title="vs float32 plain decoding")
    axes[1].set(xlabel="reference's top-2 margin at the divergence (nats, capped at 5)", ylabel="prompts")
    for ax in axes:
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path, prompts = load(args)
    outputs: dict[tuple[str, str], list[list[int]]] = {}
    margins: list[list[float]] = []
    for method, dtype in CONFIGS:
        print(f"=== {method}, {dtype} ===", file=sys.stderr)
        ref = (method, dtype) == ("plain", "float32")
        outputs[(method, dtype)], m = generate(path, prompts, method, dtype, args, logprobs=ref)
        if ref:
            margins = m
    rows = analyse(outputs, margins)
    print(table(rows))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"precision_{Path(path).name}_n{args.num_prompts}_t{args.max_tokens}"
    title = f"{Path(path).name}: {len(prompts)} prompts x {args.max_tokens} tokens, greedy"
    plot(rows, args.max_tokens, out / f"{stem}.png", title)
    print(f"chart: {out / f'{stem}.png'}")
    append_jsonl(out / f"{stem}.jsonl", vars(args), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
