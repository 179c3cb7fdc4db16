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

`--clock` times instead of profiling, with no profiler's inflation: the plugin's hooks (`LookaheadEngine`'s methods) and
the phases of vLLM's step around them are wrapped from outside with a clock, during the measured batch only, and printed
as milliseconds per engine step, then the batch's tokens per step and vLLM's draft and acceptance counters (two methods
whose steps cost the same differ by these). What the plugin costs a step is its hooks' rows; `runner._sample` includes
the `lookahead: sample` hook, which includes vLLM's own sampler. `--method ngram` or `suffix` runs vLLM's own method
under the same clock (its drafting is the `propose_draft_token_ids` row), for a step-by-step comparison.
`--parts` clocks the plugin's own pieces as well (`PARTS`: the trees' sources, merging, sizing, verification, the
fit's solve), microseconds a step and a call: each clock costs about a microsecond, so compare within one table.
`--random-input-len N` generates vLLM's own random prompts (as `vllm bench throughput --dataset-name random` does, N
tokens each) instead of the set's, and `--temperature 1` samples as `vllm bench throughput` does:

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/diagnostics/profile_engine.py --clock \
        --compiled --random-input-len 128 --temperature 1 --num-prompts 64 --max-tokens 128 --method none
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import import_module

from vllm_lookahead.devtools import bench

# (row, module, class, method) timed by --clock, in the order of a step
CLOCKED = (
    ("engine step (LLMEngine.step)", "vllm.v1.engine.llm_engine", "LLMEngine", "step"),
    ("scheduler.schedule", "vllm.v1.core.sched.scheduler", "Scheduler", "schedule"),
    ("runner.execute_model", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model"),
    ("- lookahead: drop_requests (in execute_model)", "vllm_lookahead.glue.engine", "LookaheadEngine", "drop_requests"),
    ("- runner._prepare_inputs (in execute_model)", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
     "_prepare_inputs"),
    ("- lookahead: begin_step (in _prepare_inputs)", "vllm_lookahead.glue.engine", "LookaheadEngine", "begin_step"),
    ("- runner._model_forward (in execute_model)", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
     "_model_forward"),
    ("runner.sample_tokens", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "sample_tokens"),
    ("- runner._sample (in sample_tokens)", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_sample"),
    ("- lookahead: sample (in _sample, vLLM's sampler included)", "vllm_lookahead.glue.engine", "LookaheadEngine",
     "sample"),
    ("- runner.propose_draft_token_ids (in sample_tokens: ngram's and suffix's drafting)",
     "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "propose_draft_token_ids"),
    ("- lookahead: propose (in propose_draft_token_ids)", "vllm_lookahead.glue.engine", "LookaheadEngine", "propose"),
    ("scheduler.update_from_output", "vllm.v1.core.sched.scheduler", "Scheduler", "update_from_output"),
)  # fmt: skip
# (row, module, class or None for a module's function, name): the plugin's own pieces, timed with `--clock --parts`
# (nested: a row includes the rows under it). A function is wrapped in the module that calls it.
PARTS = (
    ("propose: each request's state caught up", "vllm_lookahead.glue.requests", "Requests", "state"),
    ("propose: the bar (score_floor, curves made)", "vllm_lookahead.glue.drafting", None, "score_floor"),
    ("propose: the step cost's curves made", "vllm_lookahead.core.cost", "StepCost", "_build"),
    ("propose: trees built (build_tree)", "vllm_lookahead.core.state", "LookaheadState", "build_tree"),
    ("- suffix-tree candidates", "vllm_lookahead.core.suffix", "SuffixCandidates", "candidates"),
    ("- prompt-lookup candidates", "vllm_lookahead.core.lookup", "LookupIndex", "candidates"),
    ("- recycled candidates", "vllm_lookahead.core.recycle", "TokenRecycler", "candidates"),
    ("- merged (build_step_tree)", "vllm_lookahead.core.state", None, "build_step_tree"),
    ("- ordered and cut (by_score)", "vllm_lookahead.core.tree", "StepTree", "by_score"),
    ("propose: sized (plan_step)", "vllm_lookahead.glue.drafting", None, "plan_step"),
    ("sample: verification (Verification.verify)", "vllm_lookahead.glue.verification", "Verification", "verify"),
    ("- the trees' rows read (pick)", "vllm_lookahead.backends.cpu.logit_rows", "CompiledRows", "pick"),
    ("- states updated (update)", "vllm_lookahead.core.state", "LookaheadState", "update"),
    ("the sources learn new tokens (_learn)", "vllm_lookahead.core.state", "LookaheadState", "_learn"),
    ("- suffix trees extended", "vllm_lookahead.core.suffix", "SuffixCandidates", "extend"),
)  # fmt: skip


@contextmanager
def clocked(on: Callable[[], bool], rows: tuple = CLOCKED) -> Iterator[tuple[dict[str, float], dict[str, int]]]:
    """Wraps every row's method or function (CLOCKED, or `rows`) with a clock (counted while `on()`); restores them
    on exit. Yields the seconds and calls per row."""
    seconds: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    saved = []

    def wrap(row: str, original: Callable) -> Callable:
        def timed(*a, **k):
            if not on():
                return original(*a, **k)
            t = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                seconds[row] += time.perf_counter() - t
                calls[row] += 1

        return timed

    for row, module, cls, name in rows:
        owner = import_module(module) if cls is None else getattr(import_module(module), cls)
        saved.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, wrap(row, getattr(owner, name)))
    try:
        yield seconds, calls
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def engine_steps(calls: dict[str, int]) -> int:
    """The measured batch's engine steps: the calls of the first clocked row, the engine's step (at least 1)."""
    return calls.get(CLOCKED[0][0], 0) or 1


def print_lookahead_stats(llm) -> dict:
    """Prints and returns the worker's `lookahead_stats`."""
    stats = llm.collective_rpc("lookahead_stats")[0]
    print("lookahead_stats (warm-up included):", json.dumps(stats, sort_keys=True))
    return stats


def clock_table(seconds: dict[str, float], calls: dict[str, int]) -> list[str]:
    """Markdown rows: each clocked row's milliseconds per engine step and its calls."""
    steps = engine_steps(calls)
    rows = [f"| per engine step ({steps} steps) | ms | calls |", "|---|---|---|"]
    for row, *_ in CLOCKED:
        if row in calls:
            rows.append(f"| {row} | {seconds[row] / steps * 1e3:.3f} | {calls[row]} |")
    return rows


def parts_table(seconds: dict[str, float], calls: dict[str, int], steps: int) -> list[str]:
    """Markdown rows: each of the plugin's PARTS, microseconds per engine step and per call, and its calls."""
    rows = ["| the plugin's parts (nested) | us a step | us a call | calls |", "|---|---|---|---|"]
    for row, *_ in PARTS:
        if calls.get(row):
            rows.append(f"| {row} | {seconds[row] / steps * 1e6:.1f} | {seconds[row] / calls[row] * 1e6:.1f} | "
                        f"{calls[row]} |")  # fmt: skip
    return rows


def random_prompts(llm, n: int, input_len: int, seed: int) -> list[str]:
    """vLLM's own random prompts, as `vllm bench throughput --dataset-name random` makes them."""
    from vllm.benchmarks.datasets.datasets import RandomDataset

    requests = RandomDataset(random_seed=seed).sample(llm.get_tokenizer(), n, input_len=input_len, output_len=1)
    return [r.prompt for r in requests]


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


def measured_batch(llm, args: argparse.Namespace, start: Callable[[], None]) -> tuple[float, int]:
    """A warm-up batch, `start()`, then the measured batch: the set's prompts, or (`--random-input-len`) vLLM's random
    ones, every request running to --max-tokens as in `vllm bench throughput`. Returns its seconds and tokens."""
    if args.random_input_len <= 0:
        _, elapsed, tokens = bench.timed_generate(llm, args, args.concurrency, start)
        return elapsed, tokens
    sp = bench.sampling_params(args)
    sp.ignore_eos = True
    llm.generate(random_prompts(llm, max(args.concurrency, 2), args.random_input_len, 1), sp, use_tqdm=False)
    start()
    t = time.perf_counter()
    outs = llm.generate(random_prompts(llm, args.num_prompts, args.random_input_len, 2), sp, use_tqdm=True)
    return time.perf_counter() - t, sum(len(o.outputs[0].token_ids) for o in outs)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", choices=("lookahead", "none", "ngram", "suffix"), default="lookahead")
    bench.add_common_args(p, dtype="bfloat16", dataset="humaneval", num_prompts=48, max_tokens=96)
    bench.add_sampling_args(p)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--top", type=int, default=25, help="rows of each table")
    p.add_argument("--clock", action="store_true", help="time the plugin's hooks and vLLM's step phases, no cProfile")
    p.add_argument("--compiled", action="store_true", help="compiled, as vllm serve runs (default: eager)")
    p.add_argument("--parts", action="store_true", help="with --clock: the plugin's own pieces too (PARTS)")
    p.add_argument("--random-input-len", type=int, default=0, help="N > 0: vLLM's random prompts of N tokens")
    p.add_argument("--save-stats", default="", help="also write the profile here (pstats), to compare two methods")
    return p.parse_args(argv)


def clock_main(args: argparse.Namespace) -> int:
    llm = bench.in_process_engine(
        args,
        args.concurrency,
        bench.speculative_config(args.method),
        enforce_eager=not args.compiled,
        disable_log_stats=False,  # spec_counters reads the stat loggers
    )
    on = [False]
    counted: list[dict] = []

    def start() -> None:
        counted.append(bench.spec_counters(llm))
        on[0] = True

    parts = PARTS if args.parts and args.method == "lookahead" else ()
    with clocked(lambda: on[0]) as (seconds, calls), clocked(lambda: on[0], parts) as (part_s, part_n):
        elapsed, tokens = measured_batch(llm, args, start)
        on[0] = False
    what = args.method + (f" {args.lookahead_config}" if args.lookahead_config else "")
    data = f"random {args.random_input_len}-token prompts" if args.random_input_len > 0 else args.dataset
    mode = "compiled" if args.compiled else "eager"
    print(f"\n{what}, {data}, {args.dtype}, {mode}, {bench.sampling_label(args)}, concurrency {args.concurrency}: "
          f"{tokens} tokens in {elapsed:.2f} s = {tokens / elapsed:.1f} tokens/s\n")  # fmt: skip
    print("\n".join(clock_table(seconds, calls)))
    print(drafting_line(bench.counters_since(counted[0], bench.spec_counters(llm)), tokens, calls))
    if parts:
        print("\n" + "\n".join(parts_table(part_s, part_n, engine_steps(calls))) + "\n")
    if args.method == "lookahead":
        print_lookahead_stats(llm)
    return 0


def drafting_line(spec: dict, tokens: int, calls: dict[str, int]) -> str:
    """The measured batch's tokens per engine step and vLLM's drafting counters (what decides tokens/s when two
    methods' steps cost the same)."""
    steps = engine_steps(calls)
    drafts, drafted, accepted = spec["drafts"], spec["draft_tokens"], spec["accepted_tokens"]
    line = f"\n{tokens / steps:.2f} tokens an engine step; {drafts} drafts (request-steps that drafted)"
    if drafts:
        line += (f", {drafted} draft tokens ({drafted / drafts:.2f} a draft), {accepted} accepted "
                 f"({accepted / max(drafted, 1):.2f} of them, {accepted / drafts:.2f} a draft)")  # fmt: skip
    return line


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.clock:
        return clock_main(args)
    llm = bench.in_process_engine(
        args, args.concurrency, bench.speculative_config(args.method), enforce_eager=not args.compiled
    )
    prof = cProfile.Profile()
    before: list[dict | None] = []

    def start() -> None:  # after the warm-up: the profiled batch only
        before.append(llm.collective_rpc("lookahead_stats")[0] if args.method == "lookahead" else None)
        prof.enable()

    try:
        seconds, tokens = measured_batch(llm, args, start)
    finally:
        prof.disable()
    if args.save_stats:
        prof.dump_stats(args.save_stats)
    what = args.method + (f" {args.lookahead_config}" if args.lookahead_config else "")
    data = f"random {args.random_input_len}-token prompts" if args.random_input_len > 0 else args.dataset
    print(f"\n{what}, {data}, {args.dtype}, {bench.sampling_label(args)}, concurrency {args.concurrency}: "
          f"{tokens} tokens in {seconds:.2f} s under cProfile = {tokens / seconds:.1f} tokens/s\n")  # fmt: skip
    if args.method == "lookahead":
        print(step_gap_line(before[0], print_lookahead_stats(llm)))
    out = io.StringIO()
    ranked = pstats.Stats(prof, stream=out)
    ranked.sort_stats("cumulative").print_stats("vllm_lookahead|model_executor/models", args.top)
    ranked.sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
