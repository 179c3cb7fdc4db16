"""Whether lookahead's scores are worth what the sizing takes them for: the nodes steps carried, binned by their
calibrated score (score x the request's `AcceptanceStats.calibration`, as the sizing weighs them), against the share
verification accepted.

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/diagnostics/score_bands.py \
        --dtype float32 --compiled --concurrency 4 --num-prompts 32 --max-tokens 128

The engine runs in this process as in `profile_engine.py` (its engine flags; lookahead always), and
`AcceptanceStats.observe_carried` is wrapped from outside during the measured batch. A band whose accepted share
over its mean score is under 1 was scored too high: the sizing took its nodes for more than they brought.
"""

from __future__ import annotations

import argparse
import sys
from bisect import bisect_right
from collections.abc import Sequence
from itertools import pairwise

from vllm_lookahead.core.acceptance import AcceptanceStats
from vllm_lookahead.devtools import bench

# Fine below 0.1: at batch 1 on a CPU the sizing takes nodes down to a score of about 0.05.
EDGES = (0.0, 0.03, 0.06, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)


class Bands:
    """Carried nodes per calibrated-score band: [nodes, summed score, accepted]."""

    def __init__(self, edges: Sequence[float] = EDGES) -> None:
        self.edges = tuple(edges)
        self.rows = [[0, 0.0, 0] for _ in self.edges[:-1]]

    def add(self, scores: Sequence[float], accepted: set[int], scale: float) -> None:
        """One carried tree's non-root scores (node j at scores[j - 1]) and its accepted node indices."""
        for j, score in enumerate(scores, start=1):
            s = score * scale
            band = min(max(bisect_right(self.edges, s) - 1, 0), len(self.rows) - 1)  # the top edge included
            row = self.rows[band]
            row[0] += 1
            row[1] += s
            row[2] += j in accepted

    def table(self) -> list[str]:
        out = ["| calibrated score | nodes | mean score | accepted | accepted / score |", "|---|---|---|---|---|"]
        for (lo, hi), (n, s, k) in zip(pairwise(self.edges), self.rows, strict=True):
            if n:
                ratio = f"{k / s:.2f}" if s > 0 else "-"
                out.append(f"| {lo:.1f}-{hi:.1f} | {n} | {s / n:.3f} | {k / n:.3f} | {ratio} |")
        return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_common_args(p, dtype="bfloat16", dataset="humaneval", num_prompts=48, max_tokens=96)
    bench.add_sampling_args(p)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--compiled", action="store_true", help="compiled, as vllm serve runs (default: eager)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bands, on = Bands(), [False]
    original = AcceptanceStats.observe_carried

    def observe_carried(self, tree, accepted):
        if on[0]:
            bands.add(tree.scores[1:], set(accepted), self.calibration)
        return original(self, tree, accepted)

    AcceptanceStats.observe_carried = observe_carried
    try:
        llm = bench.in_process_engine(args, args.concurrency, bench.LOOKAHEAD, enforce_eager=not args.compiled)
        _, elapsed, tokens = bench.timed_generate(llm, args, args.concurrency, lambda: on.__setitem__(0, True))
    finally:
        AcceptanceStats.observe_carried = original
    print(f"\nlookahead, {args.dataset}, {args.dtype}, concurrency {args.concurrency}: {tokens} tokens in "
          f"{elapsed:.1f} s = {tokens / elapsed:.1f} tokens/s\n")  # fmt: skip
    print("\n".join(bands.table()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
