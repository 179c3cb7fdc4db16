"""What a step of a size not seen before costs vLLM's CPU matmuls: the oneDNN primitive built per step size.

    python -m vllm_lookahead.cpu_runtime run -- python benchmarks/matmul_sizes.py --dtype bfloat16

vLLM on a CPU runs each linear layer through a oneDNN handler (`_custom_ops.create_onednn_mm`), which builds a matmul
primitive per number of rows (a step's tokens) and keeps 32 of them per weight shape, shared by every layer of that
shape (vLLM's `csrc/cpu/dnnl_helper.cpp`). Lookahead's steps come in more sizes than plain decoding's, so this asks
what a size costs. For each weight shape of the embedded model's linear layers (random weights), the mean
microseconds of a call:
- hit: at sizes the handler keeps (30 sizes in turn);
- first: at sizes never seen before (oneDNN builds and compiles the primitive);
- rebuilt: at 40 sizes in turn, more than the 32 kept, so that every call rebuilds its primitive (from oneDNN's
  process-wide cache of compiled primitives).
The last row sums the shapes: a step of a new size builds one primitive per shape (the layers sharing a shape share
it), so it pays the sum once, and a rebuild's sum each time its size has fallen out of the 32 kept.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HIT_SIZES = range(11, 41)  # 30 sizes: all kept after the first pass
FIRST_SIZES = range(200, 216)  # never used before in the process
CYCLE_SIZES = range(41, 81)  # 40 sizes through 32 places: each call rebuilds


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

    handler = ops.create_onednn_mm(torch.randn(n, k, dtype=dtype).t(), 32)
    xs = {m: torch.randn(m, k, dtype=dtype) for m in (*HIT_SIZES, *FIRST_SIZES, *CYCLE_SIZES)}

    def mean_us(sizes: range | list[int], passes: int) -> float:
        t = time.perf_counter()
        for _ in range(passes):
            for m in sizes:
                ops.onednn_mm(handler, xs[m], None)
        return (time.perf_counter() - t) * 1e6 / (passes * len(sizes))

    mean_us(HIT_SIZES, 1)  # build them
    hit = mean_us(HIT_SIZES, reps)
    first = mean_us(FIRST_SIZES, 1)
    mean_us(CYCLE_SIZES, 1)
    rebuilt = mean_us(CYCLE_SIZES, reps)
    return hit, first, rebuilt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.model is None:
        from vllm_lookahead.models import default_model_path

        args.model = default_model_path()
    config = json.loads((Path(args.model) / "config.json").read_text())
    dtype = getattr(torch, args.dtype)
    print(f"{Path(args.model).name}, {args.dtype}, {torch.get_num_threads()} threads: microseconds a call\n")
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
