"""What one more row (a step's token) costs the linear layers of a whole forward: vLLM's CPU matmuls by row count.

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/diagnostics/matmul_rows.py
    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/diagnostics/matmul_rows.py --dtype bfloat16 \
        --rows 1,2,4,8

A forward's linear layers are most of a step's time on a CPU, and the part that grows with the step's tokens. This
runs them as vLLM does (one oneDNN handler per weight, `_custom_ops.create_onednn_mm`, which builds a matmul primitive
per row count and keeps 32 of them) with the
embedded model's shapes and random weights: every layer its own weight, so that a pass streams the model's weights
from memory as a real forward does, plus the LM head over every row (vLLM computes logits for every draft token).
For each row count it prints the milliseconds of one pass over every layer (median of --reps passes, the counts
interleaved), the milliseconds each added row cost since the previous count, the multiply-add rate of those added rows
(GFLOP/s: 2 FLOPs a multiply-add), and a straight line fitted over every count. Where the rate is near the CPU's peak
for the dtype, a row is compute-bound: no kernel makes it cheaper, and a tree node pays only if it is accepted often
enough. Where the first rows are nearly free (the pass is bound by reading the weights), small trees are cheap: the
knee `sizing.StepCost` fits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

DEFAULT_ROWS = "1,2,4,6,8,12,16,24,32"
KEPT = 32  # primitives (row counts) a handler keeps: vLLM's default for its linear layers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--model", default=None, help="a model folder with config.json (default: the embedded model)")
    p.add_argument("--rows", default=DEFAULT_ROWS, help="row counts (a step's tokens), comma-separated, rising")
    p.add_argument("--reps", type=int, default=15, help="passes timed per row count (the median is printed)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = p.parse_args(argv)
    try:
        args.row_list = [int(r) for r in args.rows.split(",") if r.strip()]
    except ValueError:
        p.error(f"--rows must be comma-separated integers (got {args.rows!r})")
    if not args.row_list or min(args.row_list) < 1 or args.row_list != sorted(set(args.row_list)):
        p.error("--rows must be distinct positive integers, rising")
    if len(args.row_list) > KEPT:  # more would rebuild every call's primitive, and time the builds
        p.error(f"--rows: at most {KEPT} counts (a handler keeps {KEPT} row counts' primitives)")
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


def set_up(args: argparse.Namespace) -> tuple[dict, object]:
    """Torch's threads, the model (the embedded one by default; args.model is set to its folder), its config and the
    dtype, and oneDNN's own start paid (one call on a throwaway shape) before anything is timed."""
    import torch
    from vllm import _custom_ops as ops

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.model is None:
        from vllm_lookahead.devtools.bench import model_path

        args.model = model_path()
    config = json.loads((Path(args.model) / "config.json").read_text())
    dtype = getattr(torch, args.dtype)
    ops.onednn_mm(
        ops.create_onednn_mm(torch.randn(8, 24, dtype=dtype).t(), KEPT), torch.randn(3, 24, dtype=dtype), None
    )
    return config, dtype


def layer_weights(config: dict) -> list[tuple[int, int, int]]:
    """(output features, input features, copies) of every linear weight a forward reads: each decoder layer's own,
    and the LM head once."""
    layers = config["num_hidden_layers"]
    return [(n, k, 1 if name == "lm_head" else layers) for name, (n, k) in linear_shapes(config).items()]


def added_rate(rows: list[int], ms: list[float], params: int) -> list[tuple[float, float | None] | None]:
    """Per row count after the first: (milliseconds an added row cost, GFLOP/s of the added rows, None where the
    added rows cost nothing measurable); None for the first."""
    out: list[tuple[float, float | None] | None] = [None]
    for r0, t0, r1, t1 in zip(rows, ms, rows[1:], ms[1:]):  # noqa: B905 (consecutive pairs: one shorter)
        per_row = (t1 - t0) / (r1 - r0)
        out.append((per_row, 2 * params / (per_row * 1e6) if per_row > 0 else None))
    return out


def line_fit(rows: list[int], ms: list[float]) -> tuple[float, float]:
    """Least-squares (ms at 0 rows, ms a row) over every count: the steady price of a row, less noisy than a step."""
    n = len(rows)
    mx, my = sum(rows) / n, sum(ms) / n
    sxx = sum((r - mx) ** 2 for r in rows)
    slope = sum((r - mx) * (t - my) for r, t in zip(rows, ms, strict=True)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from vllm import _custom_ops as ops

    config, dtype = set_up(args)
    handlers = []  # (handler, input features), in a forward's order of weights (layer by layer is not needed)
    params = 0
    for n, k, copies in layer_weights(config):
        for _ in range(copies):
            handlers.append((ops.create_onednn_mm(torch.randn(n, k, dtype=dtype).t(), KEPT), k))
        params += n * k * copies
    print(f"{Path(args.model).name}, {args.dtype}, {torch.get_num_threads()} threads: {len(handlers)} weights, "
          f"{params / 1e6:.1f} M parameters ({params * dtype.itemsize / 2**20:.0f} MiB) read a pass\n")  # fmt: skip
    inputs = {r: {k: torch.randn(r, k, dtype=dtype) for k in {k for _, k in handlers}} for r in args.row_list}
    for r in args.row_list:  # builds each handler's primitive for every row count; not timed
        for h, k in handlers:
            ops.onednn_mm(h, inputs[r][k], None)
    times: dict[int, list[float]] = {r: [] for r in args.row_list}
    for _ in range(args.reps):  # the counts interleaved, so that the machine's drift reaches them all alike
        for r in args.row_list:
            t = time.perf_counter()
            for h, k in handlers:
                ops.onednn_mm(h, inputs[r][k], None)
            times[r].append(time.perf_counter() - t)
    ms = [statistics.median(times[r]) * 1e3 for r in args.row_list]
    print(f"| rows | ms a pass | x {args.row_list[0]} row(s) | ms an added row | GFLOP/s of the added rows |")
    print("|---|---|---|---|---|")
    for r, t, added in zip(args.row_list, ms, added_rate(args.row_list, ms, params), strict=True):
        if added is None:
            tail = "| | |"
        else:
            tail = f"| {added[0]:.2f} | {'-' if added[1] is None else f'{added[1]:.0f}'} |"
        print(f"| {r} | {t:.1f} | {t / ms[0]:.2f}x {tail}")
    if len(args.row_list) > 1:
        fixed, slope = line_fit(args.row_list, ms)
        rate = f"{2 * params / (slope * 1e6):.0f} GFLOP/s" if slope > 0 else "no measurable price"
        print(f"\nline over every count: {fixed:.1f} ms + {slope:.2f} ms a row ({rate})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
