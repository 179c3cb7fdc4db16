"""The CUDA path on a GPU without vLLM: the checks the first GPU run makes before any engine starts
(`benchmarks/gpu_check.py` runs this first).

    PYTHONPATH=. python3 benchmarks/diagnostics/gpu_glue.py --out gpu_glue          # 2-4 min on an H100
    PYTHONPATH=. python3 benchmarks/diagnostics/gpu_glue.py --device cpu --quick --skip-kernel --out /tmp/gg   # logic

Needs torch, triton, numpy (matplotlib for the plot); no vLLM, no network. Run from the repository root with
PYTHONPATH=. so that `vllm_lookahead` imports.

1. compile: with a fresh Triton cache, the first launch of every kernel variant the engine warms up
   (`tree_kernel.variants()`: BLOCK_M x split, the merge with each split, both KV-move kernels) on a 7B-like layer
   (32 query heads, 8 KV heads, head size 128, bfloat16), each timed: what a first request would wait without the
   engine's warm-up.
2. glue: the backend's `prepare` / `attend` / `relocate` on caches shaped as vLLM 0.32 allocates them: one int8
   allocation holding three layers, in vLLM's LBNHC (its default), BLNHC and LBHNC layouts, the query a strided slice
   of a fused QKV tensor, the output padded past the real tokens and poisoned with NaN. Tree rows against the
   plain-torch reference, every other row as vLLM's forward (stood in for by a fill) left it, the padding untouched,
   accepted nodes' KV moved in every layer.
3. moves: `relocation.move_cells` with 1, 16, 17 and 200 moves over 32 layers against torch, and its time.
4. syncs: whole steps of the CUDA path (`vllm_lookahead/devtools/cuda_step.py`: positions, descriptors, every layer's
   attention, verification, KV moves; the sampler a torch copy of vLLM's GPU path) under
   `torch.cuda.set_sync_debug_mode("warn")`: the synchronizing calls of a step with 1 and 32 trees of 16 nodes and 2
   trees of 128 nodes, greedy and sampled, must not grow with trees or nodes (and each step's output is checked).
5. kernel: `gpu_tree_attention.py --quick` (its correctness cases and its timing table), into --out/kernel.

Prints each check, writes gpu_glue.json and gpu_glue.png into --out. Exits 1 if a check fails, 2 if the package
cannot be imported or there is no CUDA device (without --device cpu).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2}
LAYOUTS = ("LBNHC", "BLNHC", "LBHNC")  # vLLM 0.32's KV cache layouts FLASH_ATTN / TRITON_ATTN may be given
MOVES = (1, 16, 17, 200)
SYNC_STEPS = ((1, 16), (32, 16), (2, 128))  # (trees, nodes)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for the JSON and the PNG")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: Triton's interpreter, tiny shapes")
    p.add_argument("--quick", action="store_true", help="smaller shapes")
    p.add_argument("--skip-kernel", action="store_true", help="leave out gpu_tree_attention.py's cases")
    return p.parse_args(argv)


# --- helpers ------------------------------------------------------------------------------------------------------


def shapes(args: argparse.Namespace) -> dict[str, Any]:
    """A layer's heads, head size and dtype: 7B-like on a GPU, tiny under the interpreter."""
    import torch

    if args.device == "cpu":
        return {"heads": 4, "kv_heads": 2, "head_size": 32, "dtype": torch.float16, "block_size": 16}
    return {"heads": 32, "kv_heads": 8, "head_size": 128, "dtype": torch.bfloat16, "block_size": 16}


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> float:
    """Seconds of one call, the device's work included."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def vllm_caches(layout: str, num_layers: int, num_blocks: int, s: dict[str, Any], device: str) -> list[Any]:
    """Per-layer [num_blocks, num_kv_heads, block_size, 2 * head_size] views of one int8 allocation, placed as vLLM
    0.32's `allocate_kv_cache` places them for `layout` (L: layer, B: block, H: head, N: token, C: K then V)."""
    import torch

    hkv, bs, c = s["kv_heads"], s["block_size"], 2 * s["head_size"]
    element = torch.tensor([], dtype=s["dtype"]).element_size()
    page = hkv * bs * c  # elements of one layer's block
    raw = torch.zeros(num_layers * num_blocks * page * element, dtype=torch.int8, device=device)
    typed = raw.view(s["dtype"])
    if layout == "LBNHC":
        layer_at, stride = num_blocks * page, (page, c, hkv * c, 1)
    elif layout == "BLNHC":
        layer_at, stride = page, (num_layers * page, c, hkv * c, 1)
    else:  # LBHNC
        layer_at, stride = num_blocks * page, (page, bs * c, c, 1)
    return [torch.as_strided(typed, (num_blocks, hkv, bs, c), stride, i * layer_at) for i in range(num_layers)]


def ancestor_mask(parents: list[int]) -> Any:
    import torch

    mask = torch.eye(len(parents), dtype=torch.bool)
    for u in range(1, len(parents)):
        mask[u, :u] = mask[parents[u], :u]
    return mask


# --- 1. compile -----------------------------------------------------------------------------------------------------


def compile_times(args: argparse.Namespace) -> dict[str, Any]:
    """First launch of every variant the engine warms up, with a fresh Triton cache (set before anything compiled)."""
    import torch

    from vllm_lookahead.backends.base import TreeRows
    from vllm_lookahead.backends.cuda import relocation, tree_kernel
    from vllm_lookahead.backends.cuda.backend import split

    s = shapes(args)
    (cache,) = vllm_caches("LBNHC", 1, 8, s, args.device)
    key_cache, value_cache = split(cache, s["head_size"])
    query = torch.zeros(1, s["heads"], s["head_size"], dtype=s["dtype"], device=args.device)
    table = torch.zeros(1, 1, dtype=torch.int32, device=args.device)
    rows = [TreeRows(0, 0, 1, 1, torch.zeros(1, dtype=torch.int32), torch.ones(1, 1, dtype=torch.bool))]
    variants = []
    for block_m, split_prefix in tree_kernel.variants():
        batch = tree_kernel.TreeBatch.build(rows, args.device, num_heads=s["heads"], num_kv_heads=s["kv_heads"],
                                            block_m=block_m, num_splits=2 if split_prefix else 1)  # fmt: skip
        out = torch.empty_like(query)

        def launch(b: Any = batch, o: Any = out) -> None:
            tree_kernel.tree_attention(query, key_cache, value_cache, table, b, 0.1, o)

        first, again = timed(launch, args.device), timed(launch, args.device)
        name = f"tree BLOCK_M {block_m}" + (" split + merge" if split_prefix else "")
        variants.append({"variant": name, "first_s": first, "again_s": again})
    cells = relocation.Cells.of([cache])
    assert cells is not None
    first = timed(lambda: relocation.warm_up(cells), args.device)
    again = timed(lambda: relocation.warm_up(cells), args.device)
    variants.append({"variant": "KV moves (both sides)", "first_s": first, "again_s": again})
    for v in variants:
        print(f"  {v['variant']:<32} first launch {v['first_s']:7.2f} s, then {v['again_s'] * 1e3:7.2f} ms")
    total = sum(v["first_s"] for v in variants)
    print(f"  all variants: {total:.1f} s cold (the engine's warm-up pays it before the first request)")
    return {"ok": True, "variants": variants, "total_s": total}


# --- 2. glue ----------------------------------------------------------------------------------------------------


def glue_case(args: argparse.Namespace, layout: str) -> dict[str, Any]:
    import torch

    from vllm_lookahead.backends.base import TreeRows
    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend, split
    from vllm_lookahead.backends.cuda.reference import reference_tree_attention

    s = shapes(args)
    heads, hkv, d, bs = s["heads"], s["kv_heads"], s["head_size"], s["block_size"]
    rng = random.Random(len(layout))
    gen = torch.Generator(device=args.device).manual_seed(7)
    reqs = [("plain", 1, 40), ("tree", 24, 100), ("plain", 7, 0), ("tree", 9, 33)]
    if not args.quick:
        reqs += [("tree", 64, 700), ("plain", 3, 200)]
    need = [-(-(n + c) // bs) for _, n, c in reqs]
    num_blocks = sum(need) + 4
    ids = list(range(1, num_blocks))
    rng.shuffle(ids)
    table = torch.zeros(len(reqs), max(need), dtype=torch.int32)
    rows, at, q_start = [], 0, 0
    for i, (kind, n, cached) in enumerate(reqs):
        table[i, : need[i]] = torch.tensor(ids[at : at + need[i]], dtype=torch.int32)
        at += need[i]
        if kind == "tree":
            mask = ancestor_mask([-1] + [rng.randrange(u) for u in range(1, n)])
            rows.append(TreeRows(i, q_start, n, n + cached, table[i].clone(), mask))
        q_start += n
    tokens, padded = q_start, q_start + 5
    caches = vllm_caches(layout, 3, num_blocks, s, args.device)
    impl_cls = type("TritonAttentionImpl", (), {})
    layers = []
    for i, cache in enumerate(caches):
        cache.copy_(torch.randn(cache.shape, generator=gen, device=args.device).to(s["dtype"]))
        impl = impl_cls()
        impl.num_heads, impl.num_kv_heads, impl.head_size, impl.scale = heads, hkv, d, d**-0.5
        layers.append(type("Layer", (), {"impl": impl, "kv_cache": cache, "layer_name": f"layers.{i}.attn"})())
    backend = CudaTreeBackend()
    problems = []
    if why := backend.check_layers(layers):
        problems.append(f"check_layers: {why}")
    plans: dict[int, object] = {}
    backend.prepare(rows, plans)
    md = type("Metadata", (), {"block_table": table.to(args.device)})()
    tree_rows = torch.zeros(padded, dtype=torch.bool, device=args.device)
    for r in rows:
        tree_rows[r.q_start : r.q_start + r.num_nodes] = True
    real = torch.arange(padded, device=args.device) < tokens

    def vllm_forward(impl, layer, query, key, value, kv_cache, attn_metadata, output):
        return output[:tokens].fill_(7.0)  # vLLM's forward writes the real tokens' rows only

    worst = 0.0
    for layer in layers:
        qkv = torch.randn(padded, (heads + 2 * hkv) * d, generator=gen, device=args.device).to(s["dtype"])
        query = qkv[:, : heads * d].view(padded, heads, d)  # a strided slice of the fused QKV tensor
        out = torch.full((padded, heads, d), float("nan"), dtype=s["dtype"], device=args.device)
        backend.attend(rows, plans, vllm_forward, layer.impl, layer, query, None, None, layer.kv_cache, md, out)
        key_cache, value_cache = split(layer.kv_cache, d)
        ref = torch.full(out.shape, float("nan"), device=args.device)
        reference_tree_attention(query, key_cache, value_cache, rows, d**-0.5, ref)
        for r in rows:
            sl = slice(r.q_start, r.q_start + r.num_nodes)
            worst = max(worst, ((out[sl].float() - ref[sl]).norm() / ref[sl].norm()).item())
        if not bool((out[real & ~tree_rows] == 7.0).all()):
            problems.append(f"{layer.layer_name}: a plain row was written")
        if not bool(torch.isnan(out[~real]).all()):
            problems.append(f"{layer.layer_name}: the padding was written")
    if worst >= TOLERANCE[str(s["dtype"]).removeprefix("torch.")]:
        problems.append(f"tree rows off the reference (rel err {worst:.2e})")
    # the second tree's accepted nodes 3, 5, 8 moved to depths 1, 2, 3 (a run over its own earlier slots)
    r = rows[1]
    prefix = r.seq_len - r.num_nodes
    slot = lambda p: int(r.block_ids[p // bs]) * bs + p % bs  # noqa: E731
    src, dst = [slot(prefix + u) for u in (3, 5, 8)], [slot(prefix + d) for d in (1, 2, 3)]
    before = [c.transpose(1, 2).reshape(-1, hkv, 2 * d).clone() for c in caches]
    backend.relocate(layers, src, dst)
    for cache, old in zip(caches, before, strict=True):
        want = old.clone()
        want[dst] = old[src]
        if not torch.equal(cache.transpose(1, 2).reshape(-1, hkv, 2 * d), want):
            problems.append("relocate: a layer's cells differ from torch's move")
            break
    ok = not problems
    print(f"  {'ok  ' if ok else 'FAIL'} {layout}: {len(rows)} trees, rel err {worst:.2e}{'; ' if problems else ''}"
          f"{'; '.join(problems)}")  # fmt: skip
    return {"layout": layout, "ok": ok, "rel_err": worst, "problems": problems}


# --- 3. moves -------------------------------------------------------------------------------------------------


def moves(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from vllm_lookahead.backends.cuda import relocation

    s = shapes(args)
    layers = 4 if args.device == "cpu" else 32
    num_blocks = 32 if args.device == "cpu" else 512
    caches = vllm_caches("LBNHC", layers, num_blocks, s, args.device)
    gen = torch.Generator(device=args.device).manual_seed(3)
    for c in caches:
        c.copy_(torch.randn(c.shape, generator=gen, device=args.device).to(s["dtype"]))
    cells = relocation.Cells.of(caches)
    assert cells is not None
    slots = num_blocks * s["block_size"]
    out = []
    for n in MOVES:
        rng = random.Random(n)
        picked = rng.sample(range(slots), 2 * n)
        # one destination is another move's source: that source must be read before it is written
        src, dst = picked[:n], (picked[1:2] + picked[n + 1 :] if n > 1 else picked[1:2])
        before = [c.transpose(1, 2).reshape(slots, -1).clone() for c in caches]
        relocation.move_cells(cells, src, dst)
        ok = True
        for c, old in zip(caches, before, strict=True):
            want = old.clone()
            want[dst] = old[src]
            ok &= bool(torch.equal(c.transpose(1, 2).reshape(slots, -1), want))
        runs = 1 if args.device == "cpu" else 5
        seconds = min(timed(lambda s=src, d=dst: relocation.move_cells(cells, s, d), args.device) for _ in range(runs))
        print(f"  {'ok  ' if ok else 'FAIL'} {n:>3} moves x {layers} layers: {seconds * 1e3:.3f} ms")
        out.append({"moves": n, "layers": layers, "ok": ok, "ms": seconds * 1e3})
    return out


# --- 4. syncs ---------------------------------------------------------------------------------------------------


def syncs(args: argparse.Namespace) -> dict[str, Any]:
    """Synchronizing calls per step (CUDA's sync debug mode), after a first step of each configuration."""
    import torch

    from vllm_lookahead.devtools import cuda_step

    if args.device != "cuda":
        print("  (no CUDA: the sync debug mode needs a GPU; tests/test_cuda_step_syncs.py counts them on a CPU)")
        return {"ok": True, "skipped": "no CUDA", "steps": []}
    steps, problems = [], []
    for sampled in (False, True):
        for trees, nodes in SYNC_STEPS:
            rig = cuda_step.make_rig(cuda_step.Config(trees, nodes, sampled=sampled, device="cuda"))
            cuda_step.step(rig)
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    start = time.perf_counter()
                    sampled_ids = cuda_step.step(rig)
                    host = time.perf_counter() - start
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            found = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message).lower()]
            outputs = cuda_step.outputs(sampled_ids)
            right = all(o == [40, 41, 42, 43, 7] for o in outputs)
            if not right:
                problems.append(f"{trees} x {nodes} {'sampled' if sampled else 'greedy'}: outputs {outputs[:2]}")
            steps.append({"sampled": sampled, "trees": trees, "nodes": nodes, "syncs": len(found),
                          "host_ms": host * 1e3, "outputs_ok": right, "calls": found[:8]})  # fmt: skip
            kind = "sampled" if sampled else "greedy"
            print(f"  {kind:<7} {trees:>2} trees x {nodes:>3} nodes: {len(found)} synchronizing call(s) a step, "
                  f"host {host * 1e3:.1f} ms{'' if right else ', WRONG OUTPUT'}")  # fmt: skip
        counts = {s["syncs"] for s in steps if s["sampled"] == sampled}
        if len(counts) > 1:
            problems.append(f"{'sampled' if sampled else 'greedy'} syncs grow with trees or nodes: {sorted(counts)}")
    for p in problems:
        print(f"  FAIL {p}")
    return {"ok": not problems, "steps": steps, "problems": problems}


# --- 5. kernel --------------------------------------------------------------------------------------------------


def kernel(args: argparse.Namespace) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("_gpu_tree_attention", HERE / "gpu_tree_attention.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script  # its dataclasses look their module up
    spec.loader.exec_module(script)
    rc = script.main(["--quick", "--device", args.device, "--out", str(args.out / "kernel")])
    return {"ok": rc == 0, "rc": rc, "report": str(args.out / "kernel" / "gpu_tree_attention.json")}


# --- report -------------------------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no plot)")
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    variants = report["compile"].get("variants", [])
    axes[0].barh([v["variant"] for v in variants], [v["first_s"] for v in variants])
    axes[0].set_xlabel("first launch (s): compile")
    axes[0].set_title("Cold compile per kernel variant")
    mv = report["moves"]
    axes[1].plot([m["moves"] for m in mv], [m["ms"] for m in mv], marker="o")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("moves")
    axes[1].set_ylabel("ms")
    axes[1].set_title(f"move_cells over {mv[0]['layers'] if mv else '?'} layers")
    steps = report["syncs"].get("steps", [])
    labels = [f"{'s' if s['sampled'] else 'g'} {s['trees']}x{s['nodes']}" for s in steps]
    axes[2].bar(labels, [s["syncs"] for s in steps])
    axes[2].set_title("synchronizing calls per step")
    axes[2].tick_params(axis="x", rotation=45)
    fig.suptitle(f"CUDA path checks on {report['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede triton's first import
    # a fresh Triton cache: the compile section times real compiles, not cache hits
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpu-glue-triton-")
    import torch

    try:
        import vllm_lookahead.backends.cuda.backend  # noqa: F401
    except ModuleNotFoundError as e:
        print(f"cannot import the package ({e}): run from the repository root with PYTHONPATH=.", file=sys.stderr)
        return 2
    import triton

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device (use --device cpu for the logic check)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (Triton interpreter)"
    print(f"device {name}, torch {torch.__version__}, triton {triton.__version__}")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    report: dict[str, Any] = {"device": name, "torch": torch.__version__, "triton": triton.__version__}
    sections: list[tuple[str, str, Callable[[], Any]]] = [
        ("compile", "cold compile of every variant the engine warms up", lambda: compile_times(args)),
        ("glue", "the backend on vLLM-shaped caches (one allocation, three layers)",
         lambda: [glue_case(args, layout) for layout in LAYOUTS]),
        ("moves", "move_cells against torch", lambda: moves(args)),
        ("syncs", "synchronizing calls per step (torch.cuda.set_sync_debug_mode)", lambda: syncs(args)),
    ]  # fmt: skip
    if not args.skip_kernel:
        sections.append(("kernel", "gpu_tree_attention.py --quick", lambda: kernel(args)))
    failed = []
    for key, title, run in sections:
        print(f"\n{key}: {title}")
        start = time.perf_counter()
        try:
            report[key] = run()
        except Exception as e:  # a section's crash is its failure; the others still run
            traceback.print_exc()
            report[key] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        items = report[key] if isinstance(report[key], list) else [report[key]]
        if not all(item.get("ok", False) for item in items):
            failed.append(key)
        print(f"  ({time.perf_counter() - start:.0f} s)")
    report["failed"] = failed
    report["seconds"] = time.perf_counter() - t0
    path = args.out / "gpu_glue.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwrote {path}")
    plot(report, args.out / "gpu_glue.png")
    print(f"total {report['seconds']:.0f} s; " + (f"FAILED: {', '.join(failed)}" if failed else "every check passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
