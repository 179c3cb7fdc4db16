"""Lookahead scaling law on our model: decoding steps against per-step FLOPs, swept over window W and n-gram N.

    python benchmarks/bench_scaling.py --windows 1,2,4,8,16 --ngrams 3,5 --num-prompts 3 --max-new-tokens 64

Runs the transformers reference decoder (`devtools.reference_decoder.lookahead_generate`, greedy, float32) on the
embedded default model and raw HumanEval prompts, first as plain decoding (W=1, G=0: one token per step, the
baseline) and then for every (N, W) with G = W, or with every G of --guess-set-size. Every run's tokens must
equal the baseline's; mismatches are counted and listed. Each configuration's tree steps are then priced at what
a vLLM step over that many tokens costs on this CPU (bench_step.py's bare steps, float32, at the context nearest
the runs' mean; `--step-costs`, by default the committed run on the default model): the estimated step cost and
tokens/s against plain decoding say which (W, N, G) pays here, not just which saves steps. Prints a markdown
table, saves a PNG in the style of the paper's scaling figure (x = log2 of the step tree's nodes, i.e. per-step
FLOPs; y = total decoding steps; one line per N, points labelled by W) and appends one JSON line per
configuration to a JSONL file; both are named after the run settings. See benchmarks/README.md ("Scaling
(reference decoder)") for the columns.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from vllm_lookahead.devtools.bench import RESULTS, append_jsonl

# bench_step.py's committed run on the default model: what a step over T tokens costs on this CPU.
DEFAULT_STEP_COSTS = str(Path(__file__).parent / "results" / "step_T8-16-24-32-64_ctx128-512-1536.jsonl")
BASELINE = {"ngram_size": 2, "window_size": 1, "guess_set_size": 0}  # a one-node tree: plain decoding


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from e
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


DATASET_NAMES = {"humaneval": "HumanEval", "sharegpt": "ShareGPT"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", type=_int_list, default=[1, 2, 4, 8, 16], help="window sizes W (comma list)")
    p.add_argument("--ngrams", type=_int_list, default=[3, 5], help="n-gram sizes N (comma list, each >= 2)")
    p.add_argument(
        "--guess-set-size",
        type=_int_list,
        default=None,
        help="guess set sizes G (comma list: every (N, W) runs with each; default: G = W)",
    )
    p.add_argument(
        "--step-costs",
        default=None,
        help="bench_step.py JSONL whose bare-step times price each configuration's steps (default: the committed "
        "one for the default model; 'none': no pricing)",
    )
    p.add_argument(
        "--suffix-candidates",
        type=int,
        default=0,
        help="suffix-tree nodes per step (default 0: the paper's window + pool only)",
    )
    p.add_argument(
        "--lookup-candidates",
        type=int,
        default=0,
        help="prompt-lookup candidates per step (default 0: the paper's window + pool only)",
    )
    p.add_argument(
        "--recycle-candidates",
        type=int,
        default=0,
        help="token-recycling nodes per step (default 0: the paper's window + pool only)",
    )
    p.add_argument("--num-prompts", type=int, default=3, help="first n prompts of the dataset")
    p.add_argument("--dataset", choices=("humaneval", "sharegpt"), default="humaneval", help="sharegpt: chat template")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt (greedy)")
    p.add_argument(
        "--model", default=None, help="a registered model name (tools.models) or a folder; default: embedded"
    )
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: leave torch's default)")
    p.add_argument("--out", default=RESULTS, help="folder for the PNG and the JSONL")
    args = p.parse_args(argv)
    if min(args.ngrams) < 2:
        p.error("--ngrams: every N must be >= 2")
    if min(args.windows) < 1:
        p.error("--windows: every W must be >= 1")
    if args.guess_set_size is not None and min(args.guess_set_size) < 0:
        p.error("--guess-set-size: every G must be >= 0")
    if args.num_prompts < 1 or args.max_new_tokens < 1:
        p.error("--num-prompts and --max-new-tokens must be >= 1")
    return args


def configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The baseline first, then every (N, W) in the order given."""
    out = [{"label": "baseline", **BASELINE}]
    g_swept = args.guess_set_size is not None and len(args.guess_set_size) > 1
    for n in args.ngrams:
        for w in args.windows:
            for g in args.guess_set_size or [w]:
                label = f"N={n} W={w}" + (f" G={g}" if g_swept else "")
                out.append({"label": label, "ngram_size": n, "window_size": w, "guess_set_size": g})
    return out


def series_of(args: argparse.Namespace, row: dict[str, Any]) -> tuple[str, str]:
    """(the line a configuration belongs to in the chart, its point's label): one line per N over the swept W,
    or per (N, W) over G when only G is swept."""
    n, w, g = row["ngram_size"], row["window_size"], row["guess_set_size"]
    gs = args.guess_set_size
    if gs is not None and len(gs) > 1 and len(args.windows) == 1:
        return f"N={n} W={w}", f"G={g}"
    return f"N={n}" + ("" if gs is None else f" G={g}"), f"W={w}"


class NodeCounter:
    """Forward pre-hook recording each target forward's input length (tree nodes; the first is the prefill)."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def __call__(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.lengths.append(int(ids.shape[-1]))


def first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def sweep_params(args: argparse.Namespace, w: int, n: int, g: int) -> Any:
    """One configuration's LookaheadParams: the window and pool as swept, the other sources as the options say
    (each off by default, so that the sweep measures the paper's method and its baseline is plain decoding)."""
    from vllm_lookahead.core.params import LookaheadParams

    return LookaheadParams(
        window_size=w,
        ngram_size=n,
        guess_set_size=g,
        lookup_candidates=args.lookup_candidates,
        suffix_candidates=args.suffix_candidates,
        recycle_candidates=args.recycle_candidates,
    )


def run_sweep(model: Any, prompt_ids: list[list[int]], args: argparse.Namespace) -> list[dict[str, Any]]:
    from tqdm import tqdm

    from vllm_lookahead.devtools.reference_decoder import lookahead_generate

    counter = NodeCounter()
    handle = model.register_forward_pre_hook(counter, with_kwargs=True)
    cfgs = configs(args)
    rows: list[dict[str, Any]] = []
    baseline_tokens: list[list[int]] = []
    bar = tqdm(total=len(cfgs) * len(prompt_ids), desc="scaling", unit="run", file=sys.stderr)
    try:
        for cfg in cfgs:
            n, w, g = cfg["ngram_size"], cfg["window_size"], cfg["guess_set_size"]
            steps = tokens = step_nodes = tree_steps = 0
            step_sizes: Counter[int] = Counter()
            mismatches: list[dict[str, Any]] = []
            t0 = time.perf_counter()
            for i, ids in enumerate(prompt_ids):
                bar.set_postfix_str(f"{cfg['label']} G={g} prompt {i}")
                counter.lengths.clear()
                out, stats = lookahead_generate(model, ids, args.max_new_tokens, sweep_params(args, w, n, g))
                steps += stats["steps"]
                tokens += stats["tokens"]
                step_nodes += sum(counter.lengths[1:])  # the prefill is not a tree step
                tree_steps += len(counter.lengths) - 1
                step_sizes.update(counter.lengths[1:])
                if cfg["label"] == "baseline":
                    baseline_tokens.append(out)
                    if stats["steps"] != stats["tokens"]:
                        print(
                            f"warning: baseline prompt {i}: {stats['steps']} steps for {stats['tokens']} tokens",
                            file=sys.stderr,
                        )
                elif out != baseline_tokens[i]:
                    at = first_difference(out, baseline_tokens[i])
                    mismatches.append(
                        {"prompt": i, "first_diff": at, "len": len(out), "baseline_len": len(baseline_tokens[i])}
                    )
                bar.update(1)
            nodes = 1 if cfg["label"] == "baseline" else sweep_params(args, w, n, g).max_tree_nodes
            series, point = series_of(args, cfg) if cfg["label"] != "baseline" else ("baseline", "W=1 G=0")
            rows.append(
                {
                    "label": cfg["label"],
                    "series": series,
                    "point": point,
                    "step_sizes": {str(t): c for t, c in sorted(step_sizes.items())},
                    "baseline": cfg["label"] == "baseline",
                    "ngram_size": None if cfg["label"] == "baseline" else n,
                    "window_size": w,
                    "guess_set_size": g,
                    "tree_nodes": nodes,
                    "log2_tree_nodes": math.log2(nodes),
                    "mean_nodes": step_nodes / tree_steps if tree_steps else None,
                    "steps": steps,
                    "tokens": tokens,
                    "compression": tokens / steps,
                    "steps_vs_baseline": steps / rows[0]["steps"] if rows else 1.0,
                    "prompts": len(prompt_ids),
                    "mismatches": len(mismatches),
                    "mismatch_detail": mismatches,
                    "seconds": time.perf_counter() - t0,
                }
            )
    finally:
        bar.close()
        handle.remove()
    return rows


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float] | None:
    """Least squares y = a + b x; returns (a, b, r2), or None with fewer than two distinct xs."""
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return a, b, (1.0 - ss_res / ss_tot) if ss_tot else 1.0


def series_names(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["series"] for r in rows if not r["baseline"]))


def fits(rows: list[dict[str, Any]]) -> dict[str, tuple[float, float, float]]:
    """Per chart line: the fit of total steps against log2(tree nodes) over its sweep."""
    out = {}
    for name in series_names(rows):
        pts = [(r["log2_tree_nodes"], r["steps"]) for r in rows if r["series"] == name]
        fit = linear_fit([p[0] for p in pts], [p[1] for p in pts])
        if fit is not None:
            out[name] = fit
    return out


def load_step_costs(path: str | Path) -> dict[int, dict[int, float]]:
    """bench_step.py's bare float32 steps: context -> {T: ms of a plain step computing T tokens and their logits}
    (the latest run's where a file holds several)."""
    costs: dict[int, dict[int, float]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "bare" and r.get("dtype") == "float32":
                costs.setdefault(int(r["context"]), {})[int(r["tokens"])] = float(r["step"])
    if not costs:
        raise ValueError(f"{path}: no bare float32 steps (bench_step.py's JSONL expected)")
    return costs


def step_cost(curve: dict[int, float], t: int) -> float:
    """ms of a step over t tokens: linear between the measured sizes, the last segment's slope beyond them."""
    ts = sorted(curve)
    if t in curve:
        return curve[t]
    lo = max([x for x in ts if x < t], default=ts[0])
    hi = min([x for x in ts if x > t], default=None)
    if hi is None:
        lo, hi = ts[-2], ts[-1]
    return curve[lo] + (curve[hi] - curve[lo]) * (t - lo) / (hi - lo)


def price(rows: list[dict[str, Any]], curve: dict[int, float]) -> None:
    """Each configuration's decoding time at the measured step costs, against plain decoding's: sum of c(T) over
    its tree steps / sum of c(1) over the baseline's."""
    one = step_cost(curve, 1)
    base = sum(c * one for c in rows[0]["step_sizes"].values())
    for r in rows:
        total = sum(c * step_cost(curve, int(t)) for t, c in r["step_sizes"].items())
        r["est_step_cost"] = total / (one * sum(r["step_sizes"].values()))  # a mean step against a plain one
        r["est_time_vs_plain"] = total / base
        r["est_speedup"] = base / total


def markdown_table(rows: list[dict[str, Any]]) -> str:
    head = [
        "N",
        "W",
        "G",
        "tree nodes",
        "log2 nodes",
        "mean nodes (measured)",
        "steps",
        "tokens",
        "tokens/step",
        "steps vs baseline",
        "mismatches",
        "seconds",
    ]
    priced = "est_speedup" in rows[0]
    if priced:
        head[-2:-2] = ["est. step cost vs plain", "est. tokens/s vs plain"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        mean = "-" if r["mean_nodes"] is None else f"{r['mean_nodes']:.1f}"
        cells = [
            "base" if r["baseline"] else str(r["ngram_size"]),
            str(r["window_size"]),
            str(r["guess_set_size"]),
            str(r["tree_nodes"]),
            f"{r['log2_tree_nodes']:.2f}",
            mean,
            str(r["steps"]),
            str(r["tokens"]),
            f"{r['compression']:.2f}",
            f"{r['steps_vs_baseline']:.3f}",
            f"{r['mismatches']}/{r['prompts']}",
            f"{r['seconds']:.1f}",
        ]
        if priced:
            cells[-2:-2] = [f"{r['est_step_cost']:.2f}x", f"{r['est_speedup']:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def save_chart(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fit_by_series = fits(rows)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    base = rows[0]
    ax.axhline(base["steps"], color="grey", linewidth=0.8, linestyle="--", label=f"plain decoding ({base['steps']})")
    ax.plot([0.0], [base["steps"]], "o", color="grey")
    ax.annotate("W=1 G=0", (0.0, base["steps"]), textcoords="offset points", xytext=(4, -12), fontsize=8, color="grey")
    for name in series_names(rows):
        pts = sorted((r for r in rows if r["series"] == name), key=lambda r: r["log2_tree_nodes"])
        xs = [r["log2_tree_nodes"] for r in pts]
        ys = [r["steps"] for r in pts]
        label = name
        if name in fit_by_series:
            a, b, r2 = fit_by_series[name]
            label += f" (fit: {b:+.1f} steps per doubling, R²={r2:.2f})"
        (line,) = ax.plot(xs, ys, "o-", label=label)
        if name in fit_by_series:
            a, b, _ = fit_by_series[name]
            ax.plot([xs[0], xs[-1]], [a + b * xs[0], a + b * xs[-1]], ":", color=line.get_color(), linewidth=1)
        for r in pts:
            bad = f" ✗{r['mismatches']}" if r["mismatches"] else ""
            ax.annotate(
                f"{r['point']}{bad}",
                (r["log2_tree_nodes"], r["steps"]),
                textcoords="offset points",
                xytext=(4, 5),
                fontsize=8,
                color=line.get_color(),
            )
    ax.set_xlabel("log2(tree nodes per step)  (per-step FLOPs)")
    ax.set_ylabel("decoding steps (total over prompts)")
    ax.set_title(title, fontsize=9)
    ax.margins(x=0.08)
    ax.grid(True, linewidth=0.4, alpha=0.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_stem(args: argparse.Namespace) -> str:
    g = "W" if args.guess_set_size is None else "-".join(map(str, args.guess_set_size))
    ws = "-".join(map(str, args.windows))
    ns = "-".join(map(str, args.ngrams))
    extra = "" if args.dataset == "humaneval" else f"_{args.dataset}"
    extra += f"_{Path(args.model).name}" if args.model else ""
    return f"scaling_W{ws}_N{ns}_G{g}_n{args.num_prompts}_t{args.max_new_tokens}{extra}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_lookahead.devtools.models import MODELS, default_model_path, prepare
    from vllm_lookahead.devtools.prompts import as_chat, humaneval_prompts, sharegpt_prompts

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model_path = str(prepare(args.model)) if args.model in MODELS else args.model or default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.eval()
    if args.dataset == "sharegpt":
        prompts = [as_chat(tokenizer, p) for p in sharegpt_prompts(args.num_prompts, max_chars=1200)]
    else:
        prompts = humaneval_prompts(args.num_prompts)
    prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]

    rows = run_sweep(model, prompt_ids, args)
    costs_path = args.step_costs or (DEFAULT_STEP_COSTS if args.model is None else None)
    cost_note = ""
    if costs_path and costs_path != "none":
        costs = load_step_costs(costs_path)
        # the step costs measured nearest the runs' mean context (prompt + half the output)
        mean_ctx = sum(len(ids) for ids in prompt_ids) / len(prompt_ids) + args.max_new_tokens / 2
        ctx = min(costs, key=lambda c: abs(c - mean_ctx))
        price(rows, costs[ctx])
        cost_note = f"; priced at the bare float32 step costs at context {ctx} of {Path(costs_path).name}"
    g_text = "G=W" if args.guess_set_size is None else "G=" + ",".join(map(str, args.guess_set_size))
    title = (
        f"{Path(model_path).name}, float32, greedy, reference decoder, {g_text}, "
        f"{len(prompts)} {DATASET_NAMES[args.dataset]} prompts x {args.max_new_tokens} tokens"
    )
    print(f"\n{title}{cost_note}\n")
    print(markdown_table(rows))
    for name, (a, b, r2) in fits(rows).items():
        print(f"\n{name}: steps = {a:.1f} {b:+.1f} * log2(tree nodes), R^2 = {r2:.3f}", end="")
    print()
    bad = [r for r in rows if r["mismatches"]]
    for r in bad:
        for m in r["mismatch_detail"]:
            print(
                f"MISMATCH {r['label']} G={r['guess_set_size']}: prompt {m['prompt']} differs from the baseline "
                f"at token {m['first_diff']} (len {m['len']} vs {m['baseline_len']})"
            )
    if not bad:
        print("all outputs identical to plain decoding")

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = run_stem(args)
    png, jsonl = out_dir / f"{stem}.png", out_dir / f"{stem}.jsonl"
    save_chart(rows, png, title)
    print(f"\nchart: {png}")
    settings = {
        "model": model_path,
        "dtype": "float32",
        "decoder": "vllm_lookahead.devtools.reference_decoder.lookahead_generate",
        "dataset": args.dataset,
        "step_costs": costs_path,
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "guess_set_size": args.guess_set_size,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }
    append_jsonl(jsonl, settings, rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
