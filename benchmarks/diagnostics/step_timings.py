"""What decides whether drafting pays at a batch size: the engine's own decoding steps by their batch, and how the
scores of the nodes it carried held up in verification.

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/diagnostics/step_timings.py \\
        --concurrency 64 --num-prompts 128 --dataset sharegpt
    ... --lookahead-config '{"step_token_budget": 2}'      # the same engine drafting nothing, to compare

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, compiled unless --eager) with lookahead and
max_num_seqs = --concurrency; after a warm-up batch on other prompts of the set, `--num-prompts` prompts are generated
at once. Two of the plugin's functions are wrapped from outside, nothing replaced: `StepCost.observe` (each decoding
step the step-cost fit is fed: requests, draft tokens, seconds from one step's start to the next's) and the
verification's per-tree count (each carried node's score and whether it was accepted). Prints:
- the steps by batch size: how many, their mean drafts, milliseconds a step and per request, and the share of the
  run's step time spent there. A run of one or two prompts a slot spends much of its time in the drain, at batch
  sizes well under --concurrency; compare a full batch's steps with and without drafts to see what drafts cost
  there, against the tokens they bring (accepted = score-weighted below);
- the carried nodes by score: how many, their mean score and the share accepted. The sizing takes a node when its
  score clears the step's bar; a score above the share accepted means nodes near the bar do not pay for themselves.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from vllm_lookahead.devtools import bench

BATCH_BINS = (1, 2, 5, 9, 17, 33, 49, 65, 129, 257, 513)  # lower bounds; a step of R requests falls in [lo, next)
SCORE_BINS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def steps_table(steps: Sequence[tuple[int, int, bool, float]]) -> list[str]:
    """Markdown rows of the steps (requests, drafts, branched, seconds) by batch size."""
    total = sum(s for *_, s in steps) or 1.0
    rows = ["| requests | steps | mean drafts | ms a step | ms a request | share of step time |", "|---" * 6 + "|"]
    for lo, hi in zip(BATCH_BINS, (*BATCH_BINS[1:], None), strict=True):
        sel = [x for x in steps if x[0] >= lo and (hi is None or x[0] < hi)]
        if not sel:
            continue
        n = len(sel)
        secs = sum(x[3] for x in sel)
        reqs = sum(x[0] for x in sel)
        span = f"{lo}" if hi == lo + 1 else f"{lo}-{'' if hi is None else hi - 1}"
        rows.append(
            f"| {span} | {n} | {sum(x[1] for x in sel) / n:.1f} | {secs / n * 1e3:.1f} | {secs / reqs * 1e3:.3f} "
            f"| {secs / total:.0%} |"
        )
    return rows


def calibration_table(nodes: Sequence[tuple[float, bool]]) -> list[str]:
    """Markdown rows of the carried nodes (score, accepted) by score."""
    rows = ["| score | nodes | mean score | accepted |", "|---|---|---|---|"]
    for lo, hi in zip(SCORE_BINS, (*SCORE_BINS[1:], None), strict=True):
        sel = [(p, a) for p, a in nodes if p >= lo and (hi is None or p < hi)]
        if not sel:
            continue
        n = len(sel)
        rows.append(
            f"| {lo:.2f}-{'1' if hi is None else f'{hi:.2f}'} | {n} | {sum(p for p, _ in sel) / n:.3f} "
            f"| {sum(a for _, a in sel) / n:.3f} |"
        )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_common_args(p, dtype="bfloat16", dataset="sharegpt", num_prompts=128, max_tokens=128)
    bench.add_sampling_args(p)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--eager", action="store_true", help="eager mode (default: compiled, as vllm serve runs)")
    args = p.parse_args(argv)
    bench.check_lookahead_config(p, args.lookahead_config)
    if args.concurrency < 2 or args.num_prompts < 1:
        p.error("--concurrency must be at least 2 (all prompts at once) and --num-prompts positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from vllm_lookahead.core.cost import StepCost
    from vllm_lookahead.glue import verification

    steps: list[tuple[int, int, bool, float]] = []
    nodes: list[tuple[float, bool]] = []
    recording = [False]
    observe, count = StepCost.observe, verification._count_sources

    def observed(self, requests: int, drafts: int, branched: bool, seconds: float) -> None:
        if recording[0]:
            steps.append((requests, drafts, branched, seconds))
        observe(self, requests, drafts, branched, seconds)

    def counted(stats, tree, accepted) -> None:
        if recording[0]:
            taken = set(accepted)
            nodes.extend((float(tree.scores[u]), u in taken) for u in range(1, tree.num_nodes))
        count(stats, tree, accepted)

    StepCost.observe, verification._count_sources = observed, counted  # one in-process engine: restored at exit
    try:
        llm = bench.in_process_engine(args, args.concurrency, enforce_eager=args.eager)
        t0 = [0.0]

        def start() -> None:
            recording[0] = True
            t0[0] = time.perf_counter()

        _, seconds, tokens = bench.timed_generate(llm, args, args.concurrency, start)
    finally:
        StepCost.observe, verification._count_sources = observe, count
    what = "lookahead" + (f" {args.lookahead_config}" if args.lookahead_config else "")
    print(f"\n{what}, {args.dataset}, {args.dtype}, {'eager' if args.eager else 'compiled'}, "
          f"{bench.sampling_label(args)}, concurrency {args.concurrency}, {args.num_prompts} prompts: "
          f"{tokens} tokens in {seconds:.2f} s = {tokens / seconds:.1f} tokens/s\n")  # fmt: skip
    print(f"decoding steps by batch size ({len(steps)} timed, {sum(s for *_, s in steps):.2f} s):\n")
    print("\n".join(steps_table(steps)))
    if nodes:
        print(f"\ncarried draft nodes by score ({len(nodes)}, {sum(a for _, a in nodes)} accepted):\n")
        print("\n".join(calibration_table(nodes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
