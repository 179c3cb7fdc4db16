"""Where an engine's time goes, by Python function: cProfile around an in-process `LLM.generate`.

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/profile_engine.py --dtype bfloat16 --concurrency 16
    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/profile_engine.py --method none ...   # plain

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with max_num_seqs = --concurrency, eager, on
HumanEval or (`--dataset sharegpt`) chat-templated ShareGPT prompts, as bench_methods feeds them (greedy unless
--temperature). After a warm-up batch on other prompts of the set, `--num-prompts` prompts are generated under
cProfile. Prints the tokens/s (cProfile slows Python-heavy code more than the forward's kernels: compare methods
within one profile's rows, not against bench_methods' figures), lookahead's worker counters (`lookahead_stats`:
drafted and accepted nodes per source, steps that ran the tree kernel, the step-cost fit), then the plugin's
functions by cumulative time and the calls they spend the most time in (`--top`). The plugin carries no profiling
code.

`--wall` times the plugin's per-step functions (`WALL_TARGETS`) by the clock instead, without cProfile: each is
wrapped for the profiled batch only, and the table gives its milliseconds per engine step (a step: one `propose`
call) and microseconds per call. Nested entries count inside their callers (`build_tree` inside `_draft`). cProfile
inflates code made of many small Python calls (the plugin's) several times more than the kernels, so its shares
mislead; the wall table is what a step actually pays.

Both modes end with the profiled batch's decoding steps as the step-cost fit times them (`sizing.StepTimer`): the
mean milliseconds from a step's start to the end of its drafting, and from there to the next step's start (vLLM's
scheduling and output processing). Read it from a `--wall` run: cProfile slows the Python between steps most.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import importlib
import io
import json
import pstats
import sys
import time

from _inprocess import (  # the scripts run from benchmarks/, on sys.path
    LOOKAHEAD,
    add_common_args,
    add_sampling_args,
    sampling_label,
    timed_generate,
)
from _inprocess import engine as in_process_engine

# What `--wall` times: (module, owner class or "" for a module function, function), callers before their callees.
WALL_TARGETS: tuple[tuple[str, str, str], ...] = (
    ("vllm_lookahead.glue.engine", "LookaheadEngine", "propose"),
    ("vllm_lookahead.glue.engine", "LookaheadEngine", "begin_step"),
    ("vllm_lookahead.glue.engine", "LookaheadEngine", "sample"),
    ("vllm_lookahead.glue.engine", "LookaheadEngine", "_verify"),
    ("vllm_lookahead.glue.engine", "LookaheadEngine", "_path_top"),
    ("vllm_lookahead.glue.engine", "", "plan_step"),
    ("vllm_lookahead.glue.engine", "", "_draw_at"),  # a sampled request's draw at a tree node (--temperature)
    ("vllm_lookahead.core.state", "LookaheadState", "build_tree"),
    ("vllm_lookahead.core.state", "", "build_step_tree"),
    ("vllm_lookahead.core.state", "LookaheadState", "catch_up"),
    ("vllm_lookahead.core.state", "LookaheadState", "update"),
    ("vllm_lookahead.core.state", "LookaheadState", "_learn"),
    ("vllm_lookahead.core.state", "LookaheadState", "_score_in_hindsight"),
    ("vllm_lookahead.core.suffix", "SuffixCandidates", "candidates"),
    ("vllm_lookahead.core.suffix", "SuffixCandidates", "extend"),
    ("vllm_lookahead.core.lookup", "LookupIndex", "candidates"),
    ("vllm_lookahead.core.lookup", "LookupIndex", "extend"),
    ("vllm_lookahead.core.pool", "NGramPool", "add_many"),
    ("vllm_lookahead.core.window", "JacobiWindow", "step"),
    ("vllm_lookahead.core.recycle", "TokenRecycler", "candidates"),
    ("vllm_lookahead.core.recycle", "TokenRecycler", "observe"),
    ("vllm_lookahead.core.tree", "StepTree", "by_score"),
    ("vllm_lookahead.core.tree", "StepTree", "truncate"),
)


class WallTimer:
    """Wall-clock seconds and calls per wrapped function; `restore` puts the originals back."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._saved: list[tuple[object, str, object]] = []

    def wrap(self, owner: object, name: str, label: str) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        if isinstance(original, (staticmethod, classmethod)) or not callable(original):
            raise TypeError(f"profile_engine --wall times plain functions and methods, not {name!r}")
        seconds, calls = self.seconds, self.calls
        seconds.setdefault(label, 0.0)
        calls.setdefault(label, 0)

        @functools.wraps(original)
        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                seconds[label] += time.perf_counter() - t
                calls[label] += 1

        self._saved.append((owner, name, original))
        setattr(owner, name, timed)

    def wrap_targets(self, targets: tuple[tuple[str, str, str], ...] = WALL_TARGETS) -> None:
        for module, cls, name in targets:
            mod = importlib.import_module(module)
            self.wrap(getattr(mod, cls) if cls else mod, name, f"{cls}.{name}" if cls else name)

    def restore(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def table(self, steps: int, rows: int) -> str:
        """Markdown rows: the most expensive functions first, ms per step and us per call."""
        lines = ["| function | ms a step | calls | us a call |", "|---|---|---|---|"]
        ranked = sorted(self.seconds, key=lambda k: -self.seconds[k])[:rows]
        for k in ranked:
            s, n = self.seconds[k], self.calls[k]
            lines.append(f"| {k} | {s * 1e3 / max(steps, 1):.3f} | {n} | {s * 1e6 / max(n, 1):.1f} |")
        return "\n".join(lines)


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
    add_common_args(p, dtype="bfloat16", dataset="humaneval", num_prompts=48, max_tokens=96)
    add_sampling_args(p)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--top", type=int, default=25, help="rows of each table")
    p.add_argument("--wall", action="store_true", help="time the plugin's functions by the clock, not cProfile")
    args = p.parse_args(argv)
    if args.wall and args.method != "lookahead":
        p.error("--wall times the plugin's functions: it needs --method lookahead")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    llm = in_process_engine(args, args.concurrency, LOOKAHEAD if args.method == "lookahead" else None)
    prof = None if args.wall else cProfile.Profile()
    timer = WallTimer()
    before: list[dict | None] = []

    def start() -> None:  # after the warm-up: the profiled batch only
        before.append(llm.collective_rpc("lookahead_stats")[0] if args.method == "lookahead" else None)
        if args.wall:
            timer.wrap_targets()
        if prof is not None:
            prof.enable()

    try:
        _, seconds, tokens = timed_generate(llm, args, args.concurrency, start)
    finally:
        if prof is not None:
            prof.disable()
        timer.restore()
    what = args.method + (f" {args.lookahead_config}" if args.lookahead_config else "")
    under = "timed by the clock" if args.wall else "under cProfile"
    print(f"\n{what}, {args.dataset}, {args.dtype}, {sampling_label(args)}, concurrency {args.concurrency}: {tokens} "
          f"tokens in {seconds:.2f} s {under} = {tokens / seconds:.1f} tokens/s\n")  # fmt: skip
    if args.method == "lookahead":
        stats = llm.collective_rpc("lookahead_stats")[0]
        print("lookahead_stats (warm-up included):", json.dumps(stats, sort_keys=True))
        print(step_gap_line(before[0], stats))
    if prof is None:
        steps = timer.calls.get("LookaheadEngine.propose", 0)
        print(f"\nPlugin functions by wall time, {steps} engine steps:\n")
        print(timer.table(steps, args.top))
        return 0
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats("vllm_lookahead|model_executor/models", args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
