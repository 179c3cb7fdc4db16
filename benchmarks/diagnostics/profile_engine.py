"""Where an engine's time goes, by Python function: cProfile around an in-process `LLM.generate`.

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/diagnostics/profile_engine.py --concurrency 16
    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/diagnostics/profile_engine.py --method none

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with max_num_seqs = --concurrency, eager, on
HumanEval or (`--dataset sharegpt`) chat-templated ShareGPT prompts, as bench_methods feeds them (greedy unless
--temperature). After a warm-up batch on other prompts of the set, `--num-prompts` prompts are generated under
cProfile. Prints the tokens/s (cProfile slows Python-heavy code more than the forward's kernels: compare methods
within one profile's rows, not against bench_methods' figures), lookahead's worker counters (`lookahead_stats`:
drafted and accepted nodes per source, steps that ran the tree kernel, the step-cost fit), then the plugin's
functions by cumulative time and the calls they spend the most time in (`--top`). The plugin carries no profiling
code, and nothing of it or of vLLM is replaced: cProfile watches every call from outside. It inflates code made of
many small Python calls (the plugin's) several times more than the kernels: compare shares within one profile.

It ends with the profiled batch's decoding steps as the engine's own step-cost fit timed them (`lookahead_stats`:
`timed_step_span`, `timed_step_gap`): the mean milliseconds from a step's start to the end of its drafting, and from
there to the next step's start (vLLM's scheduling and output processing), both slowed by the profiler.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys

from vllm_lookahead.devtools import bench


def step_gap_line(before: dict[str, float], after: dict[str, float]) -> str:
    """The profiled batch's decoding steps as the step-cost fit timed them (`sizing.StepTimer`): their mean span,
    start to end of drafting, and the mean gap to the next step's start (the engine's scheduling and output
    processing), from the worker's totals before and after the batch."""
    n = after["timed_steps"] - before["timed_steps"]
    if n <= 0:
        return "no decoding step timed in the profiled batch"

    def total(k: str) -> float:
        return after[k] * after["timed_steps"] - before[k] * before["timed_steps"]

    span, gap = total("timed_step_span") / n, total("timed_step_gap") / n
    return (f"{n} decoding steps timed for the step-cost fit: {span * 1e3:.2f} ms to the end of drafting, then "
            f"{gap * 1e3:.2f} ms to the next step ({gap / (span + gap):.1%} of a step)")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", choices=("lookahead", "none"), default="lookahead")
    bench.add_common_args(p, dtype="bfloat16", dataset="humaneval", num_prompts=48, max_tokens=96)
    bench.add_sampling_args(p)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--top", type=int, default=25, help="rows of each table")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    llm = bench.in_process_engine(args, args.concurrency, bench.LOOKAHEAD if args.method == "lookahead" else None)
    prof = cProfile.Profile()
    before: list[dict | None] = []

    def start() -> None:  # after the warm-up: the profiled batch only
        before.append(llm.collective_rpc("lookahead_stats")[0] if args.method == "lookahead" else None)
        prof.enable()

    try:
        _, seconds, tokens = bench.timed_generate(llm, args, args.concurrency, start)
    finally:
        prof.disable()
    what = args.method + (f" {args.lookahead_config}" if args.lookahead_config else "")
    print(f"\n{what}, {args.dataset}, {args.dtype}, {bench.sampling_label(args)}, concurrency {args.concurrency}: "
          f"{tokens} tokens in {seconds:.2f} s under cProfile = {tokens / seconds:.1f} tokens/s\n")  # fmt: skip
    if args.method == "lookahead":
        stats = llm.collective_rpc("lookahead_stats")[0]
        print("lookahead_stats (warm-up included):", json.dumps(stats, sort_keys=True))
        print(step_gap_line(before[0], stats))
    out = io.StringIO()
    ranked = pstats.Stats(prof, stream=out)
    ranked.sort_stats("cumulative").print_stats("vllm_lookahead|model_executor/models", args.top)
    ranked.sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
