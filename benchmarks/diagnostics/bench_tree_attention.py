"""One attention layer with lookahead trees, per path: what the tree rows cost against a causal chain of the same rows.

    python benchmarks/diagnostics/bench_tree_attention.py         # contexts 128,512,1536 x trees 8..64, fp32+bf16
    python benchmarks/diagnostics/bench_tree_attention.py --requests 4 --decodes 8   # 4 trees beside 8 decodes

On the default model's attention shape (9 query heads, 3 KV heads of 64; `--heads`, `--kv-heads`, `--head-size`),
a synthetic step is written into vLLM's paged CPU cache with vLLM's own writer (block size 128, as vLLM's CPU
default): `--requests` tree requests of T nodes (random trees) after a cached context of P tokens, beside
`--decodes` plain decoding requests. Per layer call, the median over `--repeats` runs of `--calls` calls:

- chain: vLLM's stock kernel over every row, tree rows read as causal chains (wrong for trees; the cost target);
- reference: the plain-torch path (the stock kernel on every row, then the tree rows recomputed);
- kernel: the plugin's fast path (the compiled kernel on the tree rows and, in the vec layout, the decoding rows);
- kernel + set-up: the same plus its per-step set-up spread over the model's layers (`--layers`, 30).

Prints a table per dtype and saves a PNG (`--out`). No engine and no model: attention alone, on random data.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from vllm_lookahead.backends.base import TreeRows
from vllm_lookahead.backends.cpu import library
from vllm_lookahead.backends.cpu.layouts import split
from vllm_lookahead.backends.cpu.plan import TreeAttentionPlan
from vllm_lookahead.backends.cpu.reference import apply_tree_attention
from vllm_lookahead.devtools.bench import RESULTS, append_jsonl
from vllm_lookahead.tools import cpu_runtime

BLOCK = 128


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--trees", default="8,16,24,32,64", help="nodes per tree")
    p.add_argument("--contexts", default="128,512,1536", help="cached tokens before each tree")
    p.add_argument("--requests", type=int, default=1, help="tree requests per step")
    p.add_argument("--decodes", type=int, default=0, help="plain decoding requests beside them")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=30, help="layers the per-step set-up is spread over")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=RESULTS)
    args = p.parse_args(argv)
    args.dtype_list = [getattr(torch, d) for d in args.dtypes.split(",")]
    args.tree_list = [int(t) for t in args.trees.split(",")]
    args.context_list = [int(c) for c in args.contexts.split(",")]
    return args


def make_step(args: argparse.Namespace, dtype: torch.dtype, context: int, nodes: int, seed: int = 0) -> SimpleNamespace:
    from vllm import _custom_ops as ops

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    reqs = [("tree", context, nodes)] * args.requests + [("plain", context, 1)] * args.decodes
    rng.shuffle(reqs)
    seq_lens = [p + q for _, p, q in reqs]
    nblk = [-(-s // BLOCK) for s in seq_lens]
    perm = list(range(sum(nblk)))
    rng.shuffle(perm)
    block_table = torch.zeros(len(reqs), max(nblk), dtype=torch.int32)
    used = 0
    for i, nb in enumerate(nblk):
        block_table[i, :nb] = torch.tensor(perm[used : used + nb], dtype=torch.int32)
        used += nb
    kv_cache = torch.zeros(len(perm), args.kv_heads, BLOCK, 2 * args.head_size, dtype=dtype)
    key_cache, value_cache = split(kv_cache)
    qsl = [0]
    for _, _, q in reqs:
        qsl.append(qsl[-1] + q)
    query = torch.randn(qsl[-1], args.heads, args.head_size, generator=gen).to(dtype)
    trees = []
    for i, (kind, p, q) in enumerate(reqs):
        s = p + q
        k = torch.randn(s, args.kv_heads, args.head_size, generator=gen).to(dtype)
        v = torch.randn(s, args.kv_heads, args.head_size, generator=gen).to(dtype)
        t = torch.arange(s)
        ops.cpu_attn_reshape_and_cache(
            k, v, key_cache, value_cache, block_table[i].long()[t // BLOCK] * BLOCK + t % BLOCK, "vec"
        )
        if kind == "tree":
            parents = [-1] + [rng.randrange(u) for u in range(1, q)]
            mask = torch.eye(q, dtype=torch.bool)
            for u in range(1, q):
                mask[u] |= mask[parents[u]]
            trees.append(TreeRows(i, qsl[i], q, s, block_table[i], mask))
    md = SimpleNamespace(
        causal=True,
        dynamic_causal=None,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=block_table,
        num_actual_tokens=qsl[-1],
    )
    impl = SimpleNamespace(
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        head_size=args.head_size,
        scale=args.head_size**-0.5,
        kv_cache_dtype="auto",
        alibi_slopes=None,
        logits_soft_cap=0,
        sinks=None,
        sliding_window=-1,
    )
    layer = SimpleNamespace(isa="vec", _k_scale_float=1.0, _v_scale_float=1.0)
    sched = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(reqs), num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.head_size,
        seq_lens=md.seq_lens, dtype=dtype, query_start_loc=md.query_start_loc, causal=True, sliding_window_size=-1,
        isa="vec", enable_kv_split=True, dynamic_causal=None, kv_cache_dtype="auto",
    )  # fmt: skip
    output = torch.empty(qsl[-1], args.heads * args.head_size, dtype=dtype)
    return SimpleNamespace(
        md=md, impl=impl, layer=layer, query=query, kv_cache=kv_cache, trees=trees, sched=sched, output=output
    )


def chain(s: SimpleNamespace) -> None:
    from vllm import _custom_ops as ops

    key_cache, value_cache = split(s.kv_cache)
    n = s.md.num_actual_tokens
    ops.cpu_attention_with_kv_cache(
        s.query, key_cache, value_cache, s.output.view(n, -1, s.impl.head_size), s.md.query_start_loc, s.md.seq_lens,
        s.impl.scale, True, None, -1, s.md.block_table, 0.0, s.sched, None,
    )  # fmt: skip


def reference(s: SimpleNamespace) -> None:
    chain(s)
    key_cache, value_cache = split(s.kv_cache)
    apply_tree_attention(s.query, key_cache, value_cache, s.output, s.trees, s.impl.scale)


def timed(fn: Any, args: argparse.Namespace) -> float:
    """Median over repeats of the mean time of one call, in microseconds."""
    fn()
    runs = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        runs.append((time.perf_counter() - t0) / args.calls * 1e6)
    return statistics.median(runs)


def measure(args: argparse.Namespace, dtype: torch.dtype, context: int, nodes: int) -> dict[str, Any]:
    s = make_step(args, dtype, context, nodes)
    lib = library.load()
    build = lambda: TreeAttentionPlan.build(lib, s.trees, s.impl, s.layer, s.query, s.kv_cache, s.md)  # noqa: E731
    plan = None if lib is None else build()
    if plan is None:
        raise RuntimeError("the compiled tree kernel is unavailable here")
    kernel = timed(lambda: plan.forward(s.layer, s.impl, s.query, s.kv_cache, s.output), args)
    setup = timed(build, args)
    row = dict(dtype=str(dtype).removeprefix("torch."), context=context, nodes=nodes, requests=args.requests)
    row |= dict(
        decodes=args.decodes, chain_us=timed(lambda: chain(s), args), reference_us=timed(lambda: reference(s), args)
    )
    row |= dict(kernel_us=kernel, setup_us=setup, kernel_step_us=kernel + setup / args.layers)
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "| context | nodes | chain µs | reference µs | kernel µs | kernel + set-up µs | kernel / chain "
        "| reference / kernel |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['context']} | {r['nodes']} | {r['chain_us']:.0f} | {r['reference_us']:.0f} | {r['kernel_us']:.0f} "
            f"| {r['kernel_step_us']:.0f} | {r['kernel_step_us'] / r['chain_us']:.2f}x "
            f"| {r['reference_us'] / r['kernel_step_us']:.1f}x |"
        )
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = sorted({r["context"] for r in rows})
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts), 3.6), squeeze=False)
    for ax, ctx in zip(axes[0], contexts, strict=True):
        rs = [r for r in rows if r["context"] == ctx]
        x = [r["nodes"] for r in rs]
        for key, label, style in (
            ("chain_us", "stock kernel, rows as chains (target)", "k--"),
            ("reference_us", "plain-torch path", "o-"),
            ("kernel_step_us", "compiled kernel (+ set-up / layers)", "s-"),
        ):
            ax.plot(x, [r[key] for r in rs], style, label=label)
        ax.set_title(f"context {ctx}")
        ax.set_xlabel("tree nodes")
        ax.set_ylabel("µs per layer")
        ax.set_yscale("log")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"threads: {torch.get_num_threads()}; {cpu_runtime.describe({})}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"tree_attention_r{args.requests}_d{args.decodes}"
    all_rows = []
    for dtype in args.dtype_list:
        rows = [measure(args, dtype, c, n) for c in args.context_list for n in args.tree_list]
        all_rows += rows
        name = str(dtype).removeprefix("torch.")
        title = (
            f"one attention layer, {args.requests} tree request(s) + {args.decodes} decoding, {name}, "
            f"{args.heads}/{args.kv_heads} heads of {args.head_size}, {torch.get_num_threads()} threads"
        )
        print(f"\n### {title}\n\n{markdown(rows)}")
        png = out / f"{stem}_{name}.png"
        plot(rows, png, title)
        print(f"\nchart: {png}")
    append_jsonl(out / f"{stem}.jsonl", {k: v for k, v in vars(args).items() if k != "dtype_list"}, all_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
