"""The Triton tree-attention kernel (vllm_lookahead/backends/cuda/tree_kernel.py) on a CUDA GPU: is it right, and
what does it cost against causal attention over the same rows?

    PYTHONPATH=. python3 benchmarks/diagnostics/gpu_tree_attention.py --out gpu_tree_attention   # ~3-4 min (H100)
    PYTHONPATH=. python3 benchmarks/diagnostics/gpu_tree_attention.py --quick --out gpu_tree_attention   # ~1 min
    PYTHONPATH=. python3 benchmarks/diagnostics/gpu_tree_attention.py --sweep --out gpu_tree_attention   # + tiling
    PYTHONPATH=. python3 benchmarks/diagnostics/gpu_tree_attention.py --device cpu --quick --out /tmp/gta  # logic only

Needs torch, triton, numpy (matplotlib for the plot, flash-attn optional); no vLLM, no network. Run from the
repository root with PYTHONPATH=. so that `vllm_lookahead` imports (its package imports no vLLM).

1. Correctness: random steps (fp16 and bf16, head sizes 64 and 128, 1 / 4 / 8 query heads a kv head, 1-64 requests
   of random trees up to 128 nodes over prefixes up to ~3000 tokens in shuffled 16-token blocks, plain rows between
   them, the output poisoned with NaN first, every tiling the kernel has) against the plain-torch reference
   (float32). Each tree's ||out - ref|| / ||ref|| must stay under 2e-3 (fp16) / 1e-2 (bf16), plain rows must stay
   NaN, no NaN in tree rows. Chains are also checked against torch's causal SDPA (lower-right), the timing baseline.
2. Timing (a 7B-like layer: 32 query heads, 8 kv heads, head size 128, bf16): trees of 16-128 nodes over prefixes of
   512-8192 tokens, 1 / 8 / 64 requests; the kernel against causal attention over the same query rows and the same
   context (SDPA with a lower-right causal mask over contiguous K/V; flash-attn's flash_attn_func if importable).
   triton.testing.do_bench medians (warm-up included; launches from Python), and the same under CUDA graphs (GPU
   time alone). Ratio = kernel / the faster causal baseline; the target is <= 1.3.
3. --sweep: for a few shapes, every tiling (BLOCK_M x prefix splits) and then launch settings, against the one
   `choose_tiling` picks.

Prints a table, writes gpu_tree_attention.json and gpu_tree_attention.png into --out. Exits 1 if any correctness
case fails (the timing still runs), 2 if the package cannot be imported.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-4}
TARGET_RATIO = 1.3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for the JSON and the PNG")
    p.add_argument("--quick", action="store_true", help="fewer cases (about a minute on an H100)")
    p.add_argument("--sweep", action="store_true", help="also time every tiling and launch setting on a few shapes")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: Triton's interpreter, tiny shapes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-timing", action="store_true")
    return p.parse_args(argv)


# --- steps ------------------------------------------------------------------------------------------------------


@dataclass
class Step:
    query: Any  # [T, H, D]
    key_cache: Any  # [num_blocks, block_size, Hkv, D]
    value_cache: Any
    block_table: Any  # int32 [num_reqs, max_blocks]
    rows: list  # TreeRows
    tree_rows: Any  # bool [T] (CPU)
    contexts: list[int]  # per request: tokens in the cache
    query_lens: list[int]


def ancestor_mask(torch, parents: list[int]):
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for u in range(1, n):
        mask[u, :u] = mask[parents[u], :u]
    return mask


def make_step(
    torch,
    TreeRows,
    reqs: list[tuple[str, int, int]],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype,
    device: str,
    rng: random.Random,
    chains: bool = False,
    interleaved_kv: bool = False,
) -> Step:
    """reqs: ("tree", num_nodes, prefix_len) or ("plain", query_len, context_len before it), in batch order. Blocks
    are shuffled over a cache with spare blocks; interleaved_kv keeps K and V block by block (strided halves)."""
    gen = torch.Generator(device=device).manual_seed(rng.randrange(2**31))
    lens = [r[1] + r[2] for r in reqs]
    need = [-(-s // block_size) for s in lens]
    num_blocks = sum(need) + max(8, sum(need) // 4)
    ids = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(rng.randrange(2**31)))
    max_blocks = max(need) + 1
    table = torch.zeros(len(reqs), max_blocks, dtype=torch.int32)
    at = 0
    for i, k in enumerate(need):
        table[i, :k] = ids[at : at + k]
        at += k
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    if interleaved_kv:
        kv = torch.randn(num_blocks, 2, *shape[1:], generator=gen, device=device).to(dtype).transpose(0, 1)
    else:
        kv = torch.randn(2, *shape, generator=gen, device=device).to(dtype)
    key_cache, value_cache = kv.unbind(0)
    block_table = table.to(device)
    rows, flags = [], []
    q_start = 0
    for i, (kind, q_len, _context) in enumerate(reqs):
        if kind == "tree":
            parents = list(range(-1, q_len - 1)) if chains else [-1] + [rng.randrange(u) for u in range(1, q_len)]
            rows.append(TreeRows(i, q_start, q_len, lens[i], block_table[i], ancestor_mask(torch, parents)))
        flags += [kind == "tree"] * q_len
        q_start += q_len
    query = torch.randn(q_start, num_heads, head_size, generator=gen, device=device).to(dtype)
    return Step(
        query, key_cache, value_cache, block_table, rows, torch.tensor(flags, dtype=torch.bool), lens,
        [r[1] for r in reqs],
    )  # fmt: skip


def random_requests(rng: random.Random, num_reqs: int, max_nodes: int, max_prefix: int) -> list[tuple[str, int, int]]:
    reqs = []
    for _ in range(num_reqs):
        if rng.random() < 0.7 or num_reqs == 1:
            n = rng.choice([1, max_nodes, rng.randint(2, max_nodes)])
            prefix = rng.choice([rng.randint(1, max_prefix), rng.randint(1, max(1, max_prefix // 8)), 16, 0])
            reqs.append(("tree", n, prefix))
        else:  # a decode row or a prefill chunk
            reqs.append(("plain", rng.choice([1, rng.randint(2, 40)]), rng.randint(0, max_prefix)))
    if not any(r[0] == "tree" for r in reqs):
        reqs[0] = ("tree", max_nodes, max_prefix)
    return reqs


# --- correctness ------------------------------------------------------------------------------------------------


def check_case(torch, tk, ref_mod, step: Step, block_m, num_splits, label: str) -> dict:
    num_heads, head_size = step.query.shape[1:]
    out = torch.full_like(step.query, float("nan"))
    batch = tk.TreeBatch.build(
        step.rows, step.query.device, num_heads=num_heads, num_kv_heads=step.key_cache.shape[2],
        block_m=block_m, num_splits=num_splits,
    )  # fmt: skip
    scale = head_size**-0.5
    tk.tree_attention(step.query, step.key_cache, step.value_cache, step.block_table, batch, scale, out)
    ref = torch.full(out.shape, float("nan"), device=out.device)
    ref_mod.reference_tree_attention(step.query, step.key_cache, step.value_cache, step.rows, scale, ref)
    tree_rows = step.tree_rows.to(out.device)
    worst = 0.0
    problems = []
    if not torch.isnan(out[~tree_rows]).all():
        problems.append("plain rows written")
    if torch.isnan(out[tree_rows]).any():
        problems.append("NaN in tree rows")
    for t in step.rows:
        sl = slice(t.q_start, t.q_start + t.num_nodes)
        err = ((out[sl].float() - ref[sl]).norm() / ref[sl].norm()).item()
        worst = max(worst, err if err == err else float("inf"))
    dtype = str(step.query.dtype).removeprefix("torch.")
    if not worst < TOLERANCE[dtype]:
        problems.append(f"relative error {worst:.2e} over {TOLERANCE[dtype]:.0e}")
    return {
        "case": label,
        "dtype": dtype,
        "head_size": head_size,
        "queries_per_kv": num_heads // step.key_cache.shape[2],
        "requests": len(step.contexts),
        "trees": len(step.rows),
        "max_nodes": max(t.num_nodes for t in step.rows),
        "max_prefix": max(t.seq_len - t.num_nodes for t in step.rows),
        "block_m": batch.block_m,
        "num_splits": batch.num_splits,
        "rel_err": worst,
        "ok": not problems,
        "problems": problems,
    }


def glue_check(torch, tk, ref_mod, TreeRows, device: str) -> list[dict]:
    """The CUDA backend's glue on this device: `attend` over a cache in vLLM's FLASH_ATTN / TRITON_ATTN layout (vLLM's
    forward stood in for by a fill), and `relocate` across 32 layers (checked, then timed)."""
    from types import SimpleNamespace

    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend

    rng = random.Random(5)
    heads, kv_heads, head_size = (4, 2, 32) if device == "cpu" else (32, 8, 128)
    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    reqs = [("plain", 1, 40), ("tree", 24, 300), ("plain", 3, 77), ("tree", 9, 1030)]
    step = make_step(
        torch, TreeRows, reqs, num_heads=heads, num_kv_heads=kv_heads, head_size=head_size, block_size=16,
        dtype=dtype, device=device, rng=rng,
    )  # fmt: skip
    kv_cache = torch.cat([step.key_cache, step.value_cache], dim=-1).contiguous().transpose(1, 2)
    impl = SimpleNamespace(num_heads=heads, num_kv_heads=kv_heads, head_size=head_size, scale=head_size**-0.5)
    md = SimpleNamespace(block_table=step.block_table)
    out = torch.full_like(step.query, float("nan"))
    backend = CudaTreeBackend()
    backend.attend(step.rows, {}, lambda *a: a[-1].fill_(7.0), impl, None, step.query, None, None, kv_cache, md, out)
    ref = torch.full(out.shape, float("nan"), device=out.device)
    ref_mod.reference_tree_attention(step.query, step.key_cache, step.value_cache, step.rows, impl.scale, ref)
    tree_rows = step.tree_rows.to(out.device)
    err = max(
        ((out[t.q_start : t.q_start + t.num_nodes].float() - ref[t.q_start : t.q_start + t.num_nodes]).norm()
         / ref[t.q_start : t.q_start + t.num_nodes].norm()).item()
        for t in step.rows
    )  # fmt: skip
    attend_ok = bool((out[~tree_rows] == 7.0).all()) and err < TOLERANCE[str(dtype).removeprefix("torch.")]
    layers = [SimpleNamespace(kv_cache=kv_cache.clone()) for _ in range(32)]
    before = [layer.kv_cache.clone() for layer in layers]
    src = [1024 + u for u in range(1, 33, 2)]
    dst = [1024 + d for d in range(1, 17)]
    backend.relocate(layers, src, dst)
    moved_ok = True
    for layer, old in zip(layers, before, strict=True):
        cells, was = layer.kv_cache.transpose(1, 2).flatten(0, 1), old.transpose(1, 2).flatten(0, 1)
        want = was.clone()
        want[dst] = was[src]
        moved_ok &= bool(torch.equal(cells, want))
    py_time, _ = make_timer(torch, device)
    ms = py_time(lambda: backend.relocate(layers, src, dst))
    print(f"  {'ok  ' if attend_ok else 'FAIL'} attend over vLLM's cache layout, rel err {err:.2e}")
    print(f"  {'ok  ' if moved_ok else 'FAIL'} relocate 16 nodes x 32 layers: {ms:.3f} ms")
    return [
        {"case": "glue attend", "ok": attend_ok, "rel_err": err, "problems": [] if attend_ok else ["attend"]},
        {"case": "glue relocate", "ok": moved_ok, "ms": ms, "problems": [] if moved_ok else ["relocate"]},
    ]


def check_chains_against_sdpa(torch, F, tk, step: Step) -> dict:
    """Chains (each node its predecessor's child) are causal rows: the kernel against SDPA's lower-right mask."""
    from torch.nn.attention.bias import causal_lower_right

    num_heads, head_size = step.query.shape[1:]
    num_kv_heads = step.key_cache.shape[2]
    out = torch.full_like(step.query, float("nan"))
    batch = tk.TreeBatch.build(step.rows, step.query.device, num_heads=num_heads, num_kv_heads=num_kv_heads)
    tk.tree_attention(step.query, step.key_cache, step.value_cache, step.block_table, batch, head_size**-0.5, out)
    from vllm_lookahead.backends.cuda.reference import gather_paged

    worst = 0.0
    for t in step.rows:
        k = gather_paged(step.key_cache, t.block_ids, t.seq_len).repeat_interleave(num_heads // num_kv_heads, 0)
        v = gather_paged(step.value_cache, t.block_ids, t.seq_len).repeat_interleave(num_heads // num_kv_heads, 0)
        q = step.query[t.q_start : t.q_start + t.num_nodes].transpose(0, 1)[None]
        want = F.scaled_dot_product_attention(
            q.float(), k[None].float(), v[None].float(), attn_mask=causal_lower_right(t.num_nodes, t.seq_len)
        )[0].transpose(0, 1)
        got = out[t.q_start : t.q_start + t.num_nodes].float()
        worst = max(worst, ((got - want).norm() / want.norm()).item())
    dtype = str(step.query.dtype).removeprefix("torch.")
    ok = worst < TOLERANCE[dtype]
    return {"case": "chains vs SDPA causal_lower_right", "dtype": dtype, "rel_err": worst, "ok": ok, "problems": []}


def correctness(torch, F, tk, ref_mod, TreeRows, args, device: str) -> list[dict]:
    rng = random.Random(args.seed)
    cpu = device == "cpu"
    combos = [(d, h, g) for d in ("float16", "bfloat16") for h in (64, 128) for g in (1, 4, 8)]
    if cpu:
        combos = [("float16", 64, 1), ("bfloat16", 128, 4), ("float32", 64, 8)]
    elif args.quick:
        combos = [("float16", 64, 1), ("float16", 128, 4), ("bfloat16", 64, 8), ("bfloat16", 128, 4),
                  ("bfloat16", 128, 1), ("float16", 64, 8)]  # fmt: skip
    tilings = [(bm, s) for bm in tk.BLOCK_M_CHOICES for s in (1, 3)] + [(None, None)]
    per_combo = 1 if (cpu or args.quick) else 2
    results = []
    i = 0
    for dtype_name, head_size, qpk in combos:
        for _ in range(per_combo):
            num_reqs = (1, 8, 64, 3)[i % 4] if not cpu else (1, 3)[i % 2]
            block_m, splits = tilings[i % len(tilings)] if i % 3 else (None, None)
            i += 1
            max_nodes, max_prefix = (12, 40) if cpu else (128, 3000)
            reqs = random_requests(rng, num_reqs, max_nodes, max_prefix)
            label = f"{dtype_name} d{head_size} qpk{qpk} reqs{num_reqs} bm{block_m} splits{splits}"
            try:
                step = make_step(
                    torch, TreeRows, reqs, num_heads=2 * qpk, num_kv_heads=2, head_size=head_size, block_size=16,
                    dtype=getattr(torch, dtype_name), device=device, rng=rng, interleaved_kv=i % 2 == 0,
                )  # fmt: skip
                r = check_case(torch, tk, ref_mod, step, block_m, splits, label)
            except Exception as e:  # one crashing case is a failure, not the end of the report
                traceback.print_exc()
                r = {"case": label, "ok": False, "problems": [f"{type(e).__name__}: {e}"], "rel_err": None}
            results.append(r)
            status = "ok  " if r["ok"] else "FAIL"
            err = r["rel_err"]
            shape = (
                f"nodes<={r.get('max_nodes')} prefix<={r.get('max_prefix')} bm {r.get('block_m')}x{r.get('num_splits')}"
            )
            print(f"  {status} {label:<48} {shape:<36} rel err {err if err is None else f'{err:.2e}'} {r['problems']}")
    try:
        step = make_step(
            torch, TreeRows, [("tree", 9, 40), ("plain", 3, 5), ("tree", 33 if cpu else 128, 70 if cpu else 1500)],
            num_heads=8, num_kv_heads=2, head_size=64 if cpu else 128, block_size=16, dtype=torch.bfloat16,
            device=device, rng=rng, chains=True,
        )  # fmt: skip
        r = check_chains_against_sdpa(torch, F, tk, step)
    except Exception as e:
        traceback.print_exc()
        r = {"case": "chains vs SDPA causal_lower_right", "ok": False, "problems": [repr(e)], "rel_err": None}
    results.append(r)
    print(f"  {'ok  ' if r['ok'] else 'FAIL'} {r['case']:<67} rel err {r['rel_err']}")
    return results


# --- timing -----------------------------------------------------------------------------------------------------


def make_timer(torch, device: str) -> tuple[Callable, Callable]:
    """(median ms with launches from Python, median ms under CUDA graphs or None)."""
    if device == "cpu":

        def cpu_time(fn: Callable) -> float:
            fn()
            times = []
            for _ in range(3):
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
            return sorted(times)[1]

        return cpu_time, lambda fn: None
    from triton.testing import do_bench, do_bench_cudagraph

    def graph_time(fn: Callable) -> float | None:
        try:
            return do_bench_cudagraph(fn, rep=50, return_mode="median")
        except Exception as e:  # capture can fail (an allocation, a sync): report None
            print(f"    (CUDA graph timing failed: {type(e).__name__}: {str(e)[:120]})")
            return None

    return (lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median")), graph_time


def causal_baselines(torch, F, step: Step, num_reqs: int, nodes: int, prefix: int) -> dict[str, Callable]:
    """Causal attention over the same rows and context: contiguous K/V [R, L, Hkv, D] (gathered from the paged
    cache once), SDPA with a lower-right causal mask (GQA natively where it can, else K/V expanded beforehand) and
    flash-attn's flash_attn_func (bottom-right causal) if importable."""
    from torch.nn.attention.bias import causal_lower_right

    from vllm_lookahead.backends.cuda.reference import gather_paged

    num_heads, head_size = step.query.shape[1:]
    num_kv_heads = step.key_cache.shape[2]
    length = prefix + nodes
    k = torch.stack([gather_paged(step.key_cache, t.block_ids, length) for t in step.rows]).transpose(1, 2)
    v = torch.stack([gather_paged(step.value_cache, t.block_ids, length) for t in step.rows]).transpose(1, 2)
    k, v = k.contiguous(), v.contiguous()  # [R, L, Hkv, D]
    q = step.query.view(num_reqs, nodes, num_heads, head_size)
    mask = causal_lower_right(nodes, length)
    scale = head_size**-0.5
    qs, ks, vs = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [R, H, n, D] views, no copy

    def sdpa_gqa():
        return F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)

    fns: dict[str, Callable] = {}
    try:
        sdpa_gqa()
        fns["sdpa"] = sdpa_gqa
    except Exception as e:
        print(f"    (SDPA lower-right with enable_gqa failed: {type(e).__name__}; K/V expanded to every head)")
        ke = ks.repeat_interleave(num_heads // num_kv_heads, 1)
        ve = vs.repeat_interleave(num_heads // num_kv_heads, 1)
        fns["sdpa"] = lambda: F.scaled_dot_product_attention(qs, ke, ve, attn_mask=mask, scale=scale)
    try:
        from flash_attn import flash_attn_func

        if step.query.is_cuda:
            fns["flash"] = lambda: flash_attn_func(q, k, v, softmax_scale=scale, causal=True)
    except ImportError:
        pass
    return fns


def timing(torch, F, tk, TreeRows, args, device: str) -> list[dict]:
    rng = random.Random(args.seed + 1)
    cpu = device == "cpu"
    if cpu:
        heads, kv_heads, head_size, dtype = 4, 2, 64, torch.bfloat16
        grid = [(n, p, r) for n in (4, 8) for p in (16,) for r in (1, 2)]
    else:
        heads, kv_heads, head_size, dtype = 32, 8, 128, torch.bfloat16
        nodes, prefixes, reqs = (16, 32, 64, 128), (512, 2048, 8192), (1, 8, 64)
        if args.quick:
            nodes, prefixes, reqs = (16, 128), (512, 8192), (1, 64)
        grid = [(n, p, r) for r in reqs for p in prefixes for n in nodes]
    py_time, graph_time = make_timer(torch, device)
    rows = []
    print(
        f"\n{'nodes':>5} {'prefix':>6} {'reqs':>4} {'tiling':>9} {'kernel':>8} {'sdpa':>8} {'flash':>8} "
        f"{'ratio':>6} | graphs: {'kernel':>8} {'best':>8} {'ratio':>6}  (ms; ratio = kernel / faster causal)"
    )
    for nodes, prefix, num_reqs in grid:
        step = make_step(
            torch, TreeRows, [("tree", nodes, prefix)] * num_reqs, num_heads=heads, num_kv_heads=kv_heads,
            head_size=head_size, block_size=16, dtype=dtype, device=device, rng=rng,
        )  # fmt: skip
        t = time.perf_counter()
        for _ in range(5):
            batch = tk.TreeBatch.build(step.rows, device, num_heads=heads, num_kv_heads=kv_heads)
        build_ms = (time.perf_counter() - t) / 5 * 1e3
        if step.query.is_cuda:
            torch.cuda.synchronize()  # the descriptors' upload ran on this stream; graph timing uses its own
        out = torch.empty_like(step.query)

        def kernel(batch=batch, out=out, step=step):
            return tk.tree_attention(
                step.query, step.key_cache, step.value_cache, step.block_table, batch, head_size**-0.5, out
            )

        fns = {"kernel": kernel, **causal_baselines(torch, F, step, num_reqs, nodes, prefix)}
        py = {name: py_time(fn) for name, fn in fns.items()}
        gr = {name: graph_time(fn) for name, fn in fns.items()}
        causal = min(v for k, v in py.items() if k != "kernel")
        gr_causal = [v for k, v in gr.items() if k != "kernel" and v is not None]
        row = {
            "nodes": nodes,
            "prefix": prefix,
            "requests": num_reqs,
            "block_m": batch.block_m,
            "num_splits": batch.num_splits,
            "build_ms": build_ms,
            "ms": py,
            "graph_ms": gr,
            "ratio": py["kernel"] / causal,
            "graph_ratio": gr["kernel"] / min(gr_causal) if gr_causal and gr["kernel"] else None,
        }
        rows.append(row)
        fmt = lambda x: f"{x:8.4f}" if x is not None else f"{'-':>8}"  # noqa: E731
        gratio = f"{row['graph_ratio']:6.2f}" if row["graph_ratio"] else f"{'-':>6}"
        print(
            f"{nodes:5d} {prefix:6d} {num_reqs:4d} {batch.block_m:>5}x{batch.num_splits:<3d} {fmt(py['kernel'])} "
            f"{fmt(py.get('sdpa'))} {fmt(py.get('flash'))} {row['ratio']:6.2f} | graphs: {fmt(gr['kernel'])} "
            f"{fmt(min(gr_causal) if gr_causal else None)} {gratio}",
            flush=True,
        )
        del step, fns, out
    return rows


def sweep(torch, tk, TreeRows, args, device: str) -> list[dict]:
    """Every tiling, then launch settings for the best, on a few shapes; against choose_tiling's pick."""
    rng = random.Random(args.seed + 2)
    cpu = device == "cpu"
    if cpu:
        heads, kv_heads, head_size, shapes = 4, 2, 64, [(4, 40, 1)]
    else:
        heads, kv_heads, head_size = 32, 8, 128
        shapes = [(16, 2048, 1), (128, 2048, 1), (32, 8192, 1), (128, 512, 8), (128, 2048, 64)]
    py_time, _ = make_timer(torch, device)
    results = []
    for nodes, prefix, num_reqs in shapes:
        step = make_step(
            torch, TreeRows, [("tree", nodes, prefix)] * num_reqs, num_heads=heads, num_kv_heads=kv_heads,
            head_size=head_size, block_size=16, dtype=torch.bfloat16, device=device, rng=rng,
        )  # fmt: skip
        out = torch.empty_like(step.query)
        auto = tk.TreeBatch.build(step.rows, device, num_heads=heads, num_kv_heads=kv_heads)

        def run(batch, step=step, out=out, **launch):
            def fn():
                return tk.tree_attention(
                    step.query, step.key_cache, step.value_cache, step.block_table, batch, head_size**-0.5, out,
                    **launch,
                )  # fmt: skip

            try:
                return py_time(fn)
            except Exception as e:  # e.g. out of shared memory for a big tile
                return f"{type(e).__name__}"

        timings = {}
        for bm in tk.BLOCK_M_CHOICES:
            for splits in (1, 2, 4, 8, 16):
                if splits > 1 and prefix < splits * 128:
                    continue
                b = tk.TreeBatch.build(
                    step.rows, device, num_heads=heads, num_kv_heads=kv_heads, block_m=bm, num_splits=splits
                )
                timings[(bm, splits)] = run(b)
        numeric = {k: v for k, v in timings.items() if isinstance(v, float)}
        best = min(numeric, key=numeric.get)
        best_batch = tk.TreeBatch.build(
            step.rows, device, num_heads=heads, num_kv_heads=kv_heads, block_m=best[0], num_splits=best[1]
        )
        launches = {}
        for block_n in (32, 64, 128):
            for warps in (4, 8):
                for stages in (2, 3, 4):
                    launches[(block_n, warps, stages)] = run(
                        best_batch, block_n=block_n, num_warps=warps, num_stages=stages
                    )
        numeric_l = {k: v for k, v in launches.items() if isinstance(v, float)}
        best_l = min(numeric_l, key=numeric_l.get) if numeric_l else None
        auto_ms = timings.get((auto.block_m, auto.num_splits))
        print(
            f"  sweep nodes {nodes} prefix {prefix} reqs {num_reqs}: choose_tiling {auto.block_m}x{auto.num_splits} "
            f"{auto_ms} ms; best tiling {best[0]}x{best[1]} {numeric[best]:.4f} ms; best launch (block_n, warps, "
            f"stages) {best_l} {numeric_l.get(best_l)} ms",
            flush=True,
        )
        results.append({
            "nodes": nodes, "prefix": prefix, "requests": num_reqs,
            "auto": [auto.block_m, auto.num_splits], "auto_ms": auto_ms,
            "tilings": {f"{k[0]}x{k[1]}": v for k, v in timings.items()},
            "launch": {f"n{k[0]}-w{k[1]}-s{k[2]}": v for k, v in launches.items()},
        })  # fmt: skip
        del step, out
    return results


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no plot)")
        return
    reqs = sorted({r["requests"] for r in rows})
    fig, axes = plt.subplots(1, len(reqs), figsize=(5 * len(reqs), 4), squeeze=False, sharey=True)
    for ax, num_reqs in zip(axes[0], reqs, strict=True):
        for prefix in sorted({r["prefix"] for r in rows}):
            pts = sorted((r["nodes"], r["ratio"], r["graph_ratio"]) for r in rows
                         if r["requests"] == num_reqs and r["prefix"] == prefix)  # fmt: skip
            if not pts:
                continue
            line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"prefix {prefix}")[0]
            if all(p[2] for p in pts):
                ax.plot([p[0] for p in pts], [p[2] for p in pts], ls=":", marker=".", color=line.get_color())
        ax.axhline(TARGET_RATIO, color="red", ls="--", lw=1, label=f"target {TARGET_RATIO}")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{num_reqs} request(s)")
        ax.set_xlabel("tree nodes")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("kernel / causal attention (solid; dotted: CUDA graphs)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Tree attention (Triton) against causal attention over the same rows")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede triton's first import
    import torch
    import torch.nn.functional as F

    try:
        from vllm_lookahead.backends.base import TreeRows
        from vllm_lookahead.backends.cuda import reference as ref_mod
        from vllm_lookahead.backends.cuda import tree_kernel as tk
    except ModuleNotFoundError as e:
        print(f"cannot import the kernel ({e}): run from the repository root with PYTHONPATH=.", file=sys.stderr)
        return 2
    import triton

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device (use --device cpu for the logic check)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"
    print(f"device {name}, torch {torch.__version__}, triton {triton.__version__}")
    try:
        import flash_attn

        flash_version = flash_attn.__version__
    except ImportError:
        flash_version = None
    print(f"flash-attn {flash_version or 'not installed'}")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    print("\ncorrectness (kernel against the float32 reference; output poisoned with NaN first)")
    checks = correctness(torch, F, tk, ref_mod, TreeRows, args, device)
    print("\nthe CUDA backend's glue (vLLM's cache layout, relocation)")
    checks += glue_check(torch, tk, ref_mod, TreeRows, device)
    failed = [c for c in checks if not c["ok"]]
    print(f"{len(checks) - len(failed)}/{len(checks)} correctness cases passed ({time.perf_counter() - t0:.0f} s)")

    rows = [] if args.skip_timing else timing(torch, F, tk, TreeRows, args, device)
    sweeps = sweep(torch, tk, TreeRows, args, device) if args.sweep else []
    if rows:
        worst = max(rows, key=lambda r: r["ratio"])
        met = sum(r["ratio"] <= TARGET_RATIO for r in rows)
        print(
            f"\nratio <= {TARGET_RATIO} in {met}/{len(rows)} shapes; worst {worst['ratio']:.2f} (nodes "
            f"{worst['nodes']}, prefix {worst['prefix']}, {worst['requests']} requests)"
        )
    report = {
        "device": name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "flash_attn": flash_version,
        "quick": args.quick,
        "correctness": checks,
        "timing": rows,
        "sweep": sweeps,
        "seconds": time.perf_counter() - t0,
    }
    path = args.out / "gpu_tree_attention.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {path}")
    if rows:
        plot(rows, args.out / "gpu_tree_attention.png")
    print(f"total {time.perf_counter() - t0:.0f} s")
    if failed:
        print(f"FAILED: {len(failed)} correctness case(s): {[c['case'] for c in failed]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
