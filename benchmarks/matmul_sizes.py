"""What a step of a size not seen before costs vLLM's CPU matmuls: the oneDNN primitive built per step size.

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/matmul_sizes.py --dtype bfloat16

vLLM on a CPU runs each linear layer through a oneDNN handler (`_custom_ops.create_onednn_mm`), which builds a matmul
primitive per number of rows (a step's tokens) and keeps 32 of them per weight shape, shared by every layer of that
shape (vLLM's `csrc/cpu/dnnl_helper.cpp`). Lookahead's steps come in more sizes than plain decoding's, so this asks
what a size costs. For each weight shape of the embedded model's linear layers (random weights), a fresh handler,
and the mean microseconds of a call at the same 16 step sizes (20-35 rows) in every column, each call timed alone:
- first: each size's first call in the process (oneDNN builds and compiles the primitive);
- hit: the same sizes again, kept by the handler;
- rebuilt: the same sizes again, each after 32 other sizes (filler calls, not timed), so that the handler has
  dropped it and rebuilds its primitive (from oneDNN's process-wide cache of compiled primitives).
The last row sums the shapes: a step of a new size builds one primitive per shape (the layers sharing a shape share
it), so it pays the sum once, and a rebuild's sum each time its size has fallen out of the 32 kept.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

MEASURED = tuple(range(20, 36))  # the step sizes timed, the same in every column
FILLERS = tuple(range(36, 68))  # 32 sizes called between two calls of a measured size: the handler keeps 32
KEPT = 32  # primitives a handler keeps (vLLM's default for its linear layers)


def rebuild_cycle(measured: tuple[int, ...], fillers: tuple[int, ...]) -> list[int]:
    """The measured sizes, each followed by an equal share of the fillers: more than KEPT other sizes come
    between two calls of one size, so whatever order the handler drops sizes in, each call rebuilds."""
    per = len(fillers) // len(measured)
    out: list[int] = []
    for i, m in enumerate(measured):
        out += [m, *fillers[i * per : (i + 1) * per]]
    return out


def call_plan(reps: int, measured: tuple[int, ...] = MEASURED, fillers: tuple[int, ...] = FILLERS):
    """(column or None for an untimed call, rows) in the order called on one fresh handler."""
    cycle = rebuild_cycle(measured, fillers)
    plan: list[tuple[str | None, int]] = [("first", m) for m in measured]
    plan += [("hit", m) for _ in range(reps) for m in measured]
    plan += [(None, m) for m in cycle]  # the fillers' own first builds
    plan += [("rebuilt" if m in measured else None, m) for _ in range(reps) for m in cycle]
    return plan


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--model", default=None, help="a model folder with config.json (default: the embedded model)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--reps", type=int, default=3, help="passes over the hit and rebuilt sizes")
    args = p.parse_args(argv)
    if args.reps < 1 or (args.threads is not None and args.threads < 1):
        p.error("--reps and --threads must be >= 1")
    return args


def linear_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """(output features, input features) of a Llama-like model's linear layers, by vLLM's fused layer names."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim", hidden // heads)
    inter = config["intermediate_size"]
    return {
        "qkv_proj": ((heads + 2 * kv_heads) * head_dim, hidden),
        "o_proj": (hidden, heads * head_dim),
        "gate_up_proj": (2 * inter, hidden),
        "down_proj": (hidden, inter),
        "lm_head": (config["vocab_size"], hidden),
    }


def time_shape(n: int, k: int, dtype: object, reps: int) -> tuple[float, float, float]:
    """Mean microseconds a call (hit, first, rebuilt) of a fresh handler of an [n, k] weight."""
    import torch
    from vllm import _custom_ops as ops

    handler = ops.create_onednn_mm(torch.randn(n, k, dtype=dtype).t(), KEPT)
    xs = {m: torch.randn(m, k, dtype=dtype) for m in (*MEASURED, *FILLERS)}
    spent: dict[str, list[float]] = {"hit": [], "first": [], "rebuilt": []}
    for column, m in call_plan(reps):
        t = time.perf_counter()
        ops.onednn_mm(handler, xs[m], None)
        if column is not None:
            spent[column].append(time.perf_counter() - t)
    hit, first, rebuilt = (sum(v) * 1e6 / len(v) for v in spent.values())
    return hit, first, rebuilt


def warm_up(dtype: object) -> None:
    """One call on a throwaway shape, so that the first shape timed does not pay the library's own start."""
    import torch
    from vllm import _custom_ops as ops

    ops.onednn_mm(
        ops.create_onednn_mm(torch.randn(8, 24, dtype=dtype).t(), KEPT), torch.randn(3, 24, dtype=dtype), None
    )


def set_up(args: argparse.Namespace) -> tuple[dict, object]:
    """The set-up both matmul benchmarks share: torch's threads, the model (the embedded one by default; args.model
    is set to its folder), its config and the dtype, and oneDNN's start paid before anything is timed."""
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.model is None:
        from vllm_lookahead.tools.models import default_model_path

        args.model = default_model_path()
    config = json.loads((Path(args.model) / "config.json").read_text())
    dtype = getattr(torch, args.dtype)
    warm_up(dtype)
    return config, dtype


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    config, dtype = set_up(args)
    print(f"{Path(args.model).name}, {args.dtype}, {torch.get_num_threads()} threads: microseconds a call\n")
    print(f"sizes {MEASURED[0]}-{MEASURED[-1]} rows in every column\n")
    print("| weight shape | layer | hit | first | rebuilt |")
    print("|---|---|---|---|---|")
    total = [0.0, 0.0, 0.0]
    for name, (n, k) in linear_shapes(config).items():
        row = time_shape(n, k, dtype, args.reps)
        total = [a + b for a, b in zip(total, row, strict=True)]
        print(f"| {n} x {k} | {name} | {row[0]:.0f} | {row[1]:.0f} | {row[2]:.0f} |")
    print(f"| all shapes | | {total[0]:.0f} | {total[1]:.0f} | {total[2]:.0f} |")
    print(
        f"\na step of a new size pays about {(total[1] - total[0]) / 1000:.2f} ms once, and "
        f"{(total[2] - total[0]) / 1000:.2f} ms each time its size was dropped from the 32 kept"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
