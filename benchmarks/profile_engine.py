"""Where an engine's time goes, by Python function: cProfile around an in-process `LLM.generate`.

    python -m vllm_lookahead.cpu_runtime run -- python benchmarks/profile_engine.py --dtype bfloat16 --concurrency 16
    python -m vllm_lookahead.cpu_runtime run -- python benchmarks/profile_engine.py --method none ...   # plain

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with max_num_seqs = --concurrency, eager, on
HumanEval or (`--dataset sharegpt`) chat-templated ShareGPT prompts, as bench_methods feeds them (greedy). After a
warm-up batch on other prompts of the set, `--num-prompts` prompts are generated under cProfile. Prints the tokens/s
(cProfile slows Python-heavy code more than the forward's kernels: compare methods within one profile's rows, not
against bench_methods' figures), lookahead's worker counters (`lookahead_stats`: drafted and accepted nodes per
source, steps that ran the tree kernel, the step-cost fit), then the plugin's functions by cumulative time and the
calls they spend the most time in (`--top`). The plugin carries no profiling code.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time

from _inprocess import (
    LOOKAHEAD,  # the scripts run from benchmarks/, which is on sys.path
    add_common_args,
)
from _inprocess import engine as in_process_engine
from _inprocess import prompts as set_prompts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", choices=("lookahead", "none"), default="lookahead")
    add_common_args(p, dtype="bfloat16", dataset="humaneval", num_prompts=48, max_tokens=96)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--top", type=int, default=25, help="rows of each table")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from vllm import SamplingParams

    llm = in_process_engine(args, args.concurrency, LOOKAHEAD if args.method == "lookahead" else None)
    prompts = set_prompts(llm, args.dataset, args.num_prompts + args.concurrency)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    # warm up on prompts outside the profiled ones: lookahead's suffix cache keeps finished outputs
    prompts, warm = prompts[: args.num_prompts], prompts[args.num_prompts :]
    llm.generate(warm, sp, use_tqdm=False)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    prof.disable()
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    what = args.method + (f" {args.lookahead_config}" if args.lookahead_config else "")
    print(f"\n{what}, {args.dataset}, {args.dtype}, concurrency {args.concurrency}: {tokens} "
          f"tokens in {seconds:.2f} s under cProfile = {tokens / seconds:.1f} tokens/s\n")  # fmt: skip
    if args.method == "lookahead":
        stats = llm.collective_rpc("lookahead_stats")[0]
        print("lookahead_stats (warm-up included):", json.dumps(stats, sort_keys=True))
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats("vllm_lookahead|model_executor/models", args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
