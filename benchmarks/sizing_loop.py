"""What a mispriced step cost costs: the sizing in a closed loop against a known step cost, no engine.

    python benchmarks/sizing_loop.py
    python benchmarks/sizing_loop.py --knee 6 --below 0.25 --above 1.3 --noise 0.06 --lines 0.5,1,2

Each step one request offers a chain of 24 nodes whose scores fall by a factor drawn per step (`--decay-low` to
`--decay-high`, then 0.6 past depth 8), `sizing.choose_sizes` takes what its cost model says pays, and the step
costs what the true model says: --fixed ms, plus --below ms a token up to --knee tokens and --above ms a token past
it, times lognormal noise (--noise). The cost models compared: the true one, frozen; the engine's own fit
(`sizing.StepCost`, learning from the noisy steps it chose); and straight lines of --lines ms a token (a fit that
settled on a line). Prints per model the expected tokens per second (the scores taken, over the true cost), as a
share of the true model's, and the drafts a step, over --seeds seeds of --steps steps (the first 500 left out).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from vllm_lookahead.core.sizing import StepCost, choose_sizes
from vllm_lookahead.core.tree import StepTree

WARMUP = 500
DEPTH = 24


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fixed", type=float, default=29.0, help="ms a step costs with no token")
    p.add_argument("--knee", type=int, default=6, help="tokens up to which a token costs --below")
    p.add_argument("--below", type=float, default=0.25, help="ms a token up to the knee")
    p.add_argument("--above", type=float, default=1.3, help="ms a token past the knee")
    p.add_argument("--noise", type=float, default=0.06, help="lognormal sigma of a step's time")
    p.add_argument("--lines", default="0.5,1,2", help="straight-line models to compare, ms a token")
    p.add_argument("--decay-low", type=float, default=0.3)
    p.add_argument("--decay-high", type=float, default=0.95)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args(argv)
    if args.steps <= WARMUP or args.seeds < 1 or args.knee < 1 or min(args.fixed, args.below, args.above) < 0:
        p.error(f"--steps must exceed {WARMUP}, --seeds and --knee be positive, the costs not negative")
    if not 0 < args.decay_low <= args.decay_high <= 1:
        p.error("--decay-low and --decay-high must satisfy 0 < low <= high <= 1")
    args.line_list = [float(x) for x in args.lines.split(",") if x.strip()]
    return args


def true_seconds(args: argparse.Namespace, tokens: int) -> float:
    ms = args.fixed + args.below * min(tokens, args.knee) + args.above * max(0, tokens - args.knee)
    return ms / 1e3


def model(args: argparse.Namespace, name: str) -> StepCost:
    if name == "fit":
        return StepCost()
    if name == "true":
        return StepCost.frozen([args.fixed / 1e3, 0.0, args.above / 1e3, 0.0, args.knee, args.below / 1e3])
    per = float(name) / 1e3  # a line: every token at the same price
    return StepCost.frozen([(args.fixed + args.below) / 1e3 - per, 0.0, per, 0.0, 1, per])


def run(args: argparse.Namespace, name: str, seed: int) -> tuple[float, float]:
    """Expected tokens per second and drafts a step after the warm-up."""
    noise, scores_rng = np.random.default_rng(seed), np.random.default_rng(seed + 1000)
    cost = model(args, name)
    chain = list(range(DEPTH + 1))
    tokens = seconds = drafts = 0.0
    for step in range(args.steps):
        q, p, scores = scores_rng.uniform(args.decay_low, args.decay_high), 1.0, [1.0]
        for d in range(DEPTH):
            p *= q if d < 8 else 0.6
            scores.append(p)
        tree = StepTree.chain(chain)
        tree.scores = scores
        size = choose_sizes([tree], [DEPTH + 1], 1, cost, DEPTH).sizes[0]
        c = true_seconds(args, size)
        cost.observe(1, size - 1, False, c * noise.lognormal(0.0, args.noise))
        if step >= WARMUP:
            tokens += sum(scores[:size])
            seconds += c
            drafts += size - 1
    return tokens / seconds, drafts / (args.steps - WARMUP)


def compare(args: argparse.Namespace) -> dict[str, tuple[float, float, float]]:
    """Per cost model: expected tokens per second, its share of the true model's, drafts a step (seed means)."""
    names = ["true", "fit", *[f"{x:g}" for x in args.line_list]]
    results = {n: [run(args, n, s) for s in range(args.seeds)] for n in names}
    truth = [r[0] for r in results["true"]]
    out = {}
    for n, rs in results.items():
        share = float(np.mean([r[0] / t for r, t in zip(rs, truth, strict=True)]))
        out[n] = (float(np.mean([r[0] for r in rs])), share, float(np.mean([r[1] for r in rs])))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print("| cost model | tokens/s (expected) | share of the true model's | drafts a step |\n|---|---|---|---|")
    for n, (rate, share, drafts) in compare(args).items():
        label = {"true": "true (frozen)", "fit": "the engine's fit"}.get(n, f"a line at {n} ms a token")
        print(f"| {label} | {rate:.1f} | {share:.1%} | {drafts:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
