"""FLOPs of a lookahead step against a plain one: a formula from the model's shape, checked against torch's FLOP
counter, and set beside the measured step time (the reference repository's issue #33).

    python benchmarks/research/bench_flops.py                  # both registered models, T = 1..64, L = 128..1536
    python benchmarks/research/bench_flops.py --models smollm2-135m-instruct --trees 1,24 --contexts 512

A step that verifies T tokens (x0 and its tree) after L cached tokens computes, per layer, the q/k/v/o projections
and the MLP for T rows and attention of T queries over L + T keys (the tree mask hides some of them, but the dense
kernels compute them all), then the LM head for all T rows (vLLM computes logits for every draft row):

    FLOPs(T, L) = 2 * T * (layers * (h*(q + 2 kv) + q*h + 3*h*i) + h*vocab) + 2 * layers * T * (L + T) * 2 * q

(h hidden size, i MLP size, q = heads * head_dim, kv = kv_heads * head_dim; 2 FLOPs per multiply-add; norms, RoPE
and activations are left out, as the counter leaves them out). The counter (`torch.utils.flop_counter.FlopCounterMode`)
runs the transformers model over the same T tokens after an L-token cache. A lookahead step costs about T times a
plain step's FLOPs; what it costs in time is measured by `bench_step.py` (`bare(T)`: a plain engine step over T
tokens); if that file's JSONL is there (`--step-jsonl`), its time ratios are drawn beside the FLOP ratios.
Prints a table and saves a PNG plus a JSONL in `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vllm_lookahead.devtools.bench import RESULTS, append_jsonl

DEFAULT_STEP_JSONL = "benchmarks/results/step_T8-16-24-32-64_ctx128-512-1536.jsonl"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct",
                   help="registered model names (vllm_lookahead.devtools.models)")  # fmt: skip
    p.add_argument("--trees", default="1,8,24,64", help="tokens per step T (1: a plain step)")
    p.add_argument("--contexts", default="128,512,1536", help="cached tokens L")
    p.add_argument("--step-jsonl", default=DEFAULT_STEP_JSONL, help="bench_step.py's JSONL for measured times")
    p.add_argument("--out", default=RESULTS)
    args = p.parse_args(argv)
    args.model_list = [m for m in args.models.split(",") if m]
    args.tree_list = [int(t) for t in args.trees.split(",")]
    args.context_list = [int(c) for c in args.contexts.split(",")]
    if not args.model_list or min(args.tree_list) < 1 or min(args.context_list) < 1:
        p.error("--models non-empty; --trees and --contexts positive")
    return args


def shape(config: Any) -> dict[str, int]:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {
        "layers": config.num_hidden_layers,
        "hidden": config.hidden_size,
        "mlp": config.intermediate_size,
        "q": config.num_attention_heads * head_dim,
        "kv": config.num_key_value_heads * head_dim,
        "vocab": config.vocab_size,
    }


def formula_flops(s: dict[str, int], tokens: int, context: int) -> dict[str, float]:
    """Matmul FLOPs of a step over `tokens` rows after `context` cached tokens: linear layers, attention, LM head."""
    h, q, kv = s["hidden"], s["q"], s["kv"]
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * s["mlp"]
    linear = 2.0 * tokens * s["layers"] * per_layer
    attention = 2.0 * s["layers"] * tokens * (context + tokens) * 2 * q
    head = 2.0 * tokens * h * s["vocab"]
    return {"linear": linear, "attention": attention, "lm_head": head, "total": linear + attention + head}


def counted_flops(model: Any, tokens: int, context: int) -> float:
    """torch's FLOP count of the model's forward over `tokens` new tokens after a `context`-token cache."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, vocab, (1, context), generator=gen)
    new = torch.randint(3, vocab, (1, tokens), generator=gen)
    with torch.inference_mode():
        cache = model(prefix, use_cache=True).past_key_values
        counter = FlopCounterMode(display=False)
        with counter:
            model(new, past_key_values=cache, use_cache=True, logits_to_keep=0)
    return float(counter.get_total_flops())


def measured_ratios(path: str) -> dict[tuple[str, int, int], float]:
    """(dtype, context, T) -> bare(T) step time / bare(1) step time, from bench_step.py's JSONL (empty if absent)."""
    p = Path(path)
    if not p.exists():
        return {}
    bare: dict[tuple[str, int, int], float] = {}
    for line in p.read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "bare" and r.get("bare_step"):
            bare[(r["dtype"], r["context"], r["tokens"])] = r["bare_step"]
    return {k: v / bare[(k[0], k[1], 1)] for k, v in bare.items() if (k[0], k[1], 1) in bare}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch
    from transformers import AutoModelForCausalLM

    from vllm_lookahead.devtools import models

    rows = []
    for name in args.model_list:
        path = models.prepare(name)
        # eager attention: its matmuls are what the counter counts (it has no rule for CPU SDPA kernels)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
        s = shape(model.config)
        for context in args.context_list:
            plain = formula_flops(s, 1, context)["total"]
            for t in args.tree_list:
                f = formula_flops(s, t, context)
                counted = counted_flops(model, t, context)
                rows.append({
                    "model": name, "context": context, "tokens": t, **{f"formula_{k}": v for k, v in f.items()},
                    "counted": counted, "formula_vs_counted": f["total"] / counted, "vs_plain": f["total"] / plain,
                })  # fmt: skip
                print(f"{name} L={context} T={t}: formula {f['total'] / 1e9:.3f} GFLOP, counted "
                      f"{counted / 1e9:.3f}", file=sys.stderr)  # fmt: skip
        del model
    return rows


def table(rows: list[dict[str, Any]], measured: dict[tuple[str, int, int], float]) -> str:
    head = ["model", "L", "T", "linear GFLOP", "attention GFLOP", "LM head GFLOP", "formula GFLOP", "counted GFLOP",
            "formula / counted", "FLOPs vs T=1", "time vs T=1, fp32", "time vs T=1, bf16"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        times = [measured.get((dt, r["context"], r["tokens"])) for dt in ("float32", "bfloat16")]
        default = r["model"] == "smollm2-135m-instruct"  # bench_step.py times the default model
        cells = [f"{x:.2f}x" if x is not None and default else "" for x in times]
        lines.append(
            f"| {r['model']} | {r['context']} | {r['tokens']} | {r['formula_linear'] / 1e9:.3f} | "
            f"{r['formula_attention'] / 1e9:.3f} | {r['formula_lm_head'] / 1e9:.3f} | {r['formula_total'] / 1e9:.3f} | "
            f"{r['counted'] / 1e9:.3f} | {r['formula_vs_counted']:.3f} | {r['vs_plain']:.1f}x | "
            f"{cells[0]} | {cells[1]} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], measured: dict[tuple[str, int, int], float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r["model"] for r in rows):
        for context in sorted({r["context"] for r in rows if r["model"] == name}):
            pts = sorted((r["tokens"], r["vs_plain"]) for r in rows if r["model"] == name and r["context"] == context)
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"FLOPs, {name}, L={context}")
    for (dtype, context), style in zip(
        sorted({(k[0], k[1]) for k in measured}),
        ("--", ":", "-.", (0, (3, 1, 1, 1)), (0, (5, 2)), (0, (1, 2))),
        strict=False,
    ):
        pts = sorted((k[2], v) for k, v in measured.items() if k[0] == dtype and k[1] == context)
        ax.plot(*zip(*pts, strict=True), "k", ls=style, marker=".", label=f"time, default model {dtype}, L={context}")
    ax.set(xscale="log", yscale="log", xlabel="tokens per step T", ylabel="relative to a plain step (T=1)",
           title="A step over T tokens: FLOPs grow as T, time on this CPU far less")  # fmt: skip
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = run(args)
    measured = measured_ratios(args.step_jsonl)
    print(table(rows, measured))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"flops_T{'-'.join(map(str, args.tree_list))}_L{'-'.join(map(str, args.context_list))}"
    plot(rows, measured, out / f"{stem}.png")
    print(f"\nplot: {out / f'{stem}.png'}")
    append_jsonl(out / f"{stem}.jsonl", {k: v for k, v in vars(args).items() if not k.endswith("_list")}, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
