"""What a decoding step costs on a GPU, and what the tree sizing's step-cost fit makes of it.

    python benchmarks/diagnostics/gpu_step_cost.py measure --out step_cost.json   # a CUDA GPU (torch only)
    python benchmarks/diagnostics/gpu_step_cost.py fit step_cost.json   # anywhere: the fit per batch size, a plot

vLLM does not run on the GPU machines this project is lent, so `measure` times a decoder of each model's shape built
here in plain torch (random bfloat16 weights; Llama layout: RMSNorm, rotary positions, grouped-query attention by
SDPA with an explicit mask over a static KV cache, SwiGLU, logits for every row as vLLM computes them for draft
tokens), each step captured in a CUDA graph as vLLM runs its decoding steps. A step has B requests, each with C
cached tokens and T new ones (x0 and T - 1 drafts), so B * T tokens. Each (shape, B, T) is the median of `--repeats`
graph replays, timed with CUDA events, after a warm-up.

`fit` gives each shape's steps to `cost.StepCost` as the engine would: its one-request steps as the start-up seed,
then each batch's steps as timed steps (each `--feed` times, in shuffled order), and prints the prices it settles on
(a step of the batch with no drafts, with as many drafts as requests, with the most measured) and the bar a draft
node's acceptance probability must clear at that batch (`sizing.score_floor`). It saves a plot of the measured steps
and the learned curves.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int


SHAPES = {
    s.name: s
    for s in (
        Shape("smollm2-135m", 576, 1536, 30, 9, 3, 49152),  # the embedded default model
        Shape("qwen2.5-0.5b", 896, 4864, 24, 14, 2, 151936),  # the embedded Qwen2.5-Coder-0.5B
        Shape("llama-2-7b", 4096, 11008, 32, 32, 32, 32000),
        Shape("tiny", 64, 128, 2, 4, 2, 256),  # for the tests
    )
}


ATTENTION = ("mask", "nomask", "none")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="time the steps (CUDA; on a CPU without graphs, for tests)")
    m.add_argument("--shapes", default="smollm2-135m,qwen2.5-0.5b,llama-2-7b", help=f"from {', '.join(SHAPES)}")
    m.add_argument("--batches", default="1,4,16,64", help="requests a step")
    m.add_argument("--tokens", default="1,2,4,8,16,32,64", help="tokens a request computes a step (x0 + drafts)")
    m.add_argument("--context", type=int, default=512, help="cached tokens a request")
    m.add_argument("--repeats", type=int, default=20)
    m.add_argument(
        "--attention",
        choices=ATTENTION,
        default="mask",
        help="mask: SDPA with the step's mask; nomask: the same without one (another kernel); none: left out",
    )
    m.add_argument("--out", type=Path, required=True)
    f = sub.add_parser("fit", help="the sizing's fit of the measured steps, per shape and batch")
    f.add_argument("json", type=Path)
    f.add_argument("--feed", type=int, default=20, help="times each measured step is fed to the fit")
    f.add_argument("--plot", type=Path, default=None, help="PNG (default: beside the JSON)")
    args = p.parse_args(argv)
    if args.cmd == "measure":
        for name in args.shapes.split(","):
            if name not in SHAPES:
                p.error(f"--shapes: unknown shape {name!r}; known: {', '.join(SHAPES)}")
        args.batches = [int(v) for v in args.batches.split(",")]
        args.tokens = [int(v) for v in args.tokens.split(",")]
        if min(args.batches) < 1 or min(args.tokens) < 1 or args.context < 1 or args.repeats < 1:
            p.error("--batches, --tokens, --context and --repeats must be >= 1")
    return args


# -- measure -----------------------------------------------------------------------------------------------------


class Decoder:
    """A Llama-shaped decoder with random weights; `reserve` gives it a static KV cache for `batch` requests of up to
    `max_len` tokens, and `step` computes `tokens` new tokens a request after `context` cached ones (their logits)."""

    def __init__(self, shape: Shape, device: Any, dtype: Any, attention: str = "mask") -> None:
        import torch

        self.attention = attention
        self.gen = torch.Generator(device=device).manual_seed(0)
        h, d = shape.hidden, shape.hidden // shape.heads
        self.shape, self.head_dim, self.device, self.dtype = shape, d, device, dtype
        w = self.random
        self.embed = w(shape.vocab, h)
        self.layers = [
            dict(
                qkv=w((shape.heads + 2 * shape.kv_heads) * d, h),
                o=w(h, shape.heads * d),
                gate_up=w(2 * shape.intermediate, h),
                down=w(h, shape.intermediate),
                n1=torch.ones(h, device=device, dtype=dtype),
                n2=torch.ones(h, device=device, dtype=dtype),
            )
            for _ in range(shape.layers)
        ]
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.cache: Any = None

    def random(self, *size: int) -> Any:
        """Random values, never zeros: zeros can time faster than real data."""
        import torch

        return (torch.randn(*size, generator=self.gen, device=self.device, dtype=torch.float32) * 0.02).to(self.dtype)

    def reserve(self, batch: int, max_len: int) -> None:
        import torch

        s, d = self.shape, self.head_dim
        self.cache = None
        self.cache = self.random(s.layers, 2, batch, s.kv_heads, max_len, d)
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        ang = torch.arange(max_len, dtype=torch.float32)[:, None] * inv[None, :]
        self.cos, self.sin = ang.cos().to(self.device, self.dtype), ang.sin().to(self.device, self.dtype)

    def step(self, ids: Any, context: int, mask: Any) -> Any:
        """ids [B, T] at positions context..context+T-1; mask [T, context + T] (True: attend)."""
        import torch
        import torch.nn.functional as F  # noqa: N812

        s, d = self.shape, self.head_dim
        b, t = ids.shape
        x = self.embed[ids]
        cos, sin = self.cos[context : context + t], self.sin[context : context + t]

        def rope(v: torch.Tensor) -> torch.Tensor:
            v1, v2 = v[..., : d // 2], v[..., d // 2 :]
            return torch.cat((v1 * cos - v2 * sin, v1 * sin + v2 * cos), dim=-1)

        def rms(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return F.rms_norm(v, (v.shape[-1],), weight, 1e-5)

        for li, layer in enumerate(self.layers):
            qkv = rms(x, layer["n1"]) @ layer["qkv"].T
            q, k, v = qkv.split((s.heads * d, s.kv_heads * d, s.kv_heads * d), dim=-1)
            q = rope(q.view(b, t, s.heads, d).transpose(1, 2))
            k = rope(k.view(b, t, s.kv_heads, d).transpose(1, 2))
            v = v.view(b, t, s.kv_heads, d).transpose(1, 2)
            self.cache[li, 0, :, :, context : context + t] = k
            self.cache[li, 1, :, :, context : context + t] = v
            keys = self.cache[li, 0, :, :, : context + t]
            values = self.cache[li, 1, :, :, : context + t]
            if self.attention == "none":  # the step's other work alone
                a = q
            else:
                a = F.scaled_dot_product_attention(
                    q,
                    keys,
                    values,
                    attn_mask=mask if self.attention == "mask" else None,
                    enable_gqa=s.kv_heads != s.heads,
                )
            x = x + a.transpose(1, 2).reshape(b, t, s.heads * d) @ layer["o"].T
            gate, up = (rms(x, layer["n2"]) @ layer["gate_up"].T).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer["down"].T
        return rms(x, self.norm) @ self.embed.T  # tied head: a row of logits per token, as for every draft token


def tree_mask(tokens: int, context: int, device: Any) -> Any:
    """Every new token sees the cached context and the new tokens up to itself (a chain; a tree's mask has as many
    entries and costs the same to apply)."""
    import torch

    mask = torch.ones(tokens, context + tokens, dtype=torch.bool, device=device)
    mask[:, context:] = torch.ones(tokens, tokens, dtype=torch.bool, device=device).tril()
    return mask


def time_step(dec: Decoder, batch: int, tokens: int, context: int, repeats: int, cuda: bool) -> float:
    """Median seconds of one step of `batch` requests x `tokens` new tokens: CUDA-graph replays timed by events on
    a GPU; plain calls by the clock elsewhere (for the tests)."""
    import statistics
    import time

    import torch

    device = dec.embed.device
    ids = torch.randint(0, dec.shape.vocab, (batch, tokens), device=device)
    mask = tree_mask(tokens, context, device)
    if not cuda:
        with torch.inference_mode():
            dec.step(ids, context, mask)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                dec.step(ids, context, mask)
                times.append(time.perf_counter() - t0)
        return statistics.median(times)
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                dec.step(ids, context, mask)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dec.step(ids, context, mask)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        del graph
    return statistics.median(times)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "context": args.context,
        "graphs": cuda,
        "attention": args.attention,
        "shapes": {},
    }
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        steps = []
        dec = Decoder(shape, device, dtype, args.attention)
        for batch in args.batches:
            dec.reserve(batch, args.context + max(args.tokens))
            for tokens in args.tokens:
                seconds = time_step(dec, batch, tokens, args.context, args.repeats, cuda)
                steps.append({"requests": batch, "tokens": batch * tokens, "seconds": seconds})
                print(f"{name} B={batch} T={tokens}: {seconds * 1e3:.3f} ms", flush=True)
        del dec
        if cuda:
            torch.cuda.empty_cache()
        result["shapes"][name] = {"shape": asdict(shape), "steps": steps}
    return result


# -- fit ---------------------------------------------------------------------------------------------------------


def fit_batch(steps: Sequence[dict[str, float]], requests: int, feed: int, seed: int = 0) -> dict[str, float]:
    """The engine's step cost after the start-up seed (the one-request steps) and this batch's measured steps `feed`
    times each, shuffled: its prices at this batch (ms) and the bar a draft node must clear there."""
    from vllm_lookahead.core.cost import StepCost
    from vllm_lookahead.core.sizing import score_floor

    cost = StepCost()
    ones = sorted((s for s in steps if s["requests"] == 1), key=lambda s: s["tokens"])
    if ones:
        cost.seed([int(s["tokens"]) for s in ones], [float(s["seconds"]) for s in ones])
    rows = [s for s in steps if s["requests"] == requests] * feed
    random.Random(seed).shuffle(rows)
    for s in rows:
        cost.observe(requests, int(s["tokens"]) - requests, False, float(s["seconds"]))
    most = max((int(s["tokens"]) for s in steps if s["requests"] == requests), default=2 * requests)
    curve = cost.curve(requests)
    return {
        "requests": requests,
        "plain_ms": curve.at(requests) * 1e3,
        "double_ms": curve.at(2 * requests) * 1e3,
        "most_tokens": most,
        "most_ms": curve.at(most) * 1e3,
        "bar": score_floor(cost, requests),
    }


def fit(path: Path, feed: int, plot: Path | None) -> list[tuple[str, dict[str, float]]]:
    data = json.loads(path.read_text())
    rows = []
    print(f"{data['device']}, {data['dtype']}, {data['context']} cached tokens a request, CUDA graphs "
          f"{data['graphs']}, attention {data.get('attention', 'mask')}")  # fmt: skip
    print("\n| shape | requests | measured ms at T = 1 / 2x / max tokens | learned ms at the same | bar a draft must "
          "clear |")  # fmt: skip
    print("|---|---|---|---|---|")
    for name, entry in data["shapes"].items():
        steps = entry["steps"]
        for requests in sorted({s["requests"] for s in steps}):
            mine = sorted((s for s in steps if s["requests"] == requests), key=lambda s: s["tokens"])
            f = fit_batch(steps, requests, feed)
            rows.append((name, f))
            two = next((s for s in mine if s["tokens"] == 2 * requests), mine[-1])
            print(f"| {name} | {requests} | {mine[0]['seconds'] * 1e3:.2f} / {two['seconds'] * 1e3:.2f} / "
                  f"{mine[-1]['seconds'] * 1e3:.2f} ({mine[-1]['tokens']}) | {f['plain_ms']:.2f} / "
                  f"{f['double_ms']:.2f} / {f['most_ms']:.2f} | {f['bar']:.3f} |")  # fmt: skip
    save_plot(data, rows, plot or path.with_suffix(".png"))
    return rows


def save_plot(data: dict[str, Any], rows: list[tuple[str, dict[str, float]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(data["shapes"])
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        steps = data["shapes"][name]["steps"]
        for requests in sorted({s["requests"] for s in steps}):
            mine = sorted((s for s in steps if s["requests"] == requests), key=lambda s: s["tokens"])
            t = [s["tokens"] / requests for s in mine]
            base = mine[0]["seconds"]
            (line,) = ax.plot(t, [s["seconds"] / base for s in mine], "o-", label=f"{requests} requests")
            f = next(f for n, f in rows if n == name and f["requests"] == requests)
            ax.annotate(f"bar {f['bar']:.3f}", (t[-1], mine[-1]["seconds"] / base), fontsize=8, color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens a request computes a step (x0 + drafts)")
        ax.set_ylabel("step time / step with no drafts")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{data['device']}, {data['dtype']}, CUDA graphs: {data['graphs']}; bar = sizing.score_floor")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"\nplot: {out}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cmd == "measure":
        result = measure(args)
        args.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    else:
        fit(args.json, args.feed, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
