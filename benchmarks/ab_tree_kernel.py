"""The compiled tree kernel's gain on a real workload, step by step: one engine, its branched steps alternately on the
kernel and on the plain-torch path.

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/ab_tree_kernel.py --dataset sharegpt --dtype bfloat16

Comparing two whole runs (`bench_methods.py --methods lookahead-reference,lookahead`) cannot resolve a gain of a few
percent on this machine: the same run repeated moves by 10%. Here one in-process engine
(VLLM_ENABLE_V1_MULTIPROCESSING=0, eager, greedy unless `--temperature`, batch `--concurrency`) generates
`--num-prompts` prompts of the set after a warm-up on other prompts of it, and every other step whose trees branch
(those that take the tree path at all; chains run vLLM's kernel either way) runs its tree rows on the plain-torch
path instead of the kernel. Each step is timed as the engine's step-cost fit times it (from the forward to the end
of the next drafting), so both halves see the same minutes of the machine, the same workload and the same tree
sizes. Prints, per path: branched steps, their mean draft tokens and mean milliseconds (with a standard error); the
time of the steps that did not branch; and the tokens/s gain the kernel gives the whole run, T_plain-torch /
T_kernel - 1, where each total is the unbranched steps plus every branched step at that path's mean; against it, the
share of a plain-torch run spent in the second computation of the tree rows (`tree_attention.attend_layer`, timed in
the plain-torch steps). The script wraps the engine's hooks from outside for the timing and the choice of path: the
plugin carries no code for it.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

from _inprocess import (  # the scripts run from benchmarks/, which is on sys.path
    add_common_args,
    add_sampling_args,
    sampling_label,
    timed_generate,
)
from _inprocess import engine as in_process_engine


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, dtype="bfloat16", dataset="sharegpt", num_prompts=20, max_tokens=128)
    add_sampling_args(p)
    p.add_argument("--concurrency", type=int, default=1)
    return p.parse_args(argv)


def summary(times: list[float]) -> tuple[float, float]:
    """Mean and its standard error, in ms."""
    if not times:
        return math.nan, math.nan
    sd = statistics.stdev(times) if len(times) > 1 else 0.0
    return 1e3 * statistics.fmean(times), 1e3 * sd / math.sqrt(len(times))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from vllm_lookahead.backends.cpu import attention as attention_path
    from vllm_lookahead.backends.cpu import plan as tree_attention_plan
    from vllm_lookahead.backends.cpu import reference as tree_attention
    from vllm_lookahead.glue import engine

    branched = [0]  # branched steps seen: odd ones take the plain-torch path
    build = tree_attention_plan.TreeAttentionPlan.build.__func__

    def alternate(cls, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        branched[0] += 1
        return None if branched[0] % 2 == 0 else build(cls, *a, **kw)

    steps: list[tuple[str, int, float]] = []  # (path, draft tokens, seconds)
    timing = {"on": False}
    begin, finish, propose = (
        engine.LookaheadEngine.begin_step,
        engine.LookaheadEngine.finish_step,
        engine.LookaheadEngine.propose,
    )

    def begin_step(self, runner, scheduler_output):  # noqa: ANN001, ANN202
        self._ab = (
            time.perf_counter(),
            "chain",
            sum(len(v) for v in scheduler_output.scheduled_spec_decode_tokens.values()),
        )
        return begin(self, runner, scheduler_output)

    def finish_step(self, runner, logits, spec_md, sampler_output, first_rows_sampled=False):  # noqa: ANN001, ANN202
        step = self.step
        if step is not None and step.attention_plans:
            start, _, drafts = self._ab
            self._ab = (start, "kernel" if attention_path.used_kernel(step) else "plain-torch", drafts)
        return finish(self, runner, logits, spec_md, sampler_output, first_rows_sampled)

    def propose_(self, runner, sampled):  # noqa: ANN001, ANN202
        try:
            return propose(self, runner, sampled)
        finally:
            ab = getattr(self, "_ab", None)
            if ab is not None and timing["on"]:
                steps.append((ab[1], ab[2], time.perf_counter() - ab[0]))
            self._ab = None

    recompute = [0.0]  # seconds in the plain-torch path's second computation of the tree rows, all layers
    attend = tree_attention.attend_layer

    def attend_layer(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        t = time.perf_counter()
        try:
            return attend(*a, **kw)
        finally:
            if timing["on"]:
                recompute[0] += time.perf_counter() - t

    tree_attention.attend_layer = attend_layer
    tree_attention_plan.TreeAttentionPlan.build = classmethod(alternate)
    engine.LookaheadEngine.begin_step = begin_step
    engine.LookaheadEngine.finish_step = finish_step
    engine.LookaheadEngine.propose = propose_

    llm = in_process_engine(args, args.concurrency)
    _, seconds, tokens = timed_generate(llm, args, args.concurrency, lambda: timing.update(on=True))

    by = {k: [s for p, _, s in steps if p == k] for k in ("kernel", "plain-torch", "chain")}
    drafts = {k: [d for p, d, _ in steps if p == k] for k in ("kernel", "plain-torch")}
    print(f"\n{args.dataset}, {args.dtype}, {sampling_label(args)}, concurrency {args.concurrency}: {tokens} tokens, "
          f"{len(steps)} steps "
          f"in {seconds:.1f} s ({tokens / seconds:.1f} tokens/s; half the branched steps on the plain-torch "
          "path)\n")  # fmt: skip
    print("| steps | count | mean draft tokens | mean ms (± s.e.) |")
    print("|---|---|---|---|")
    for k in ("kernel", "plain-torch"):
        m, se = summary(by[k])
        d = statistics.fmean(drafts[k]) if drafts[k] else math.nan
        print(f"| branched, {k} | {len(by[k])} | {d:.1f} | {m:.1f} ± {se:.1f} |")
    m, se = summary(by["chain"])
    print(f"| not branched | {len(by['chain'])} | | {m:.1f} ± {se:.1f} |")
    mk, sk = summary(by["kernel"])
    mr, sr = summary(by["plain-torch"])
    nb, rest = len(by["kernel"]) + len(by["plain-torch"]), sum(by["chain"])
    t_kernel, t_ref = rest + nb * mk / 1e3, rest + nb * mr / 1e3
    gain = t_ref / t_kernel - 1
    se_gain = nb * math.hypot(sk, sr) / 1e3 / t_kernel
    # The second computation's share of a run on the plain-torch path: its time per plain-torch branched step,
    # every branched step paying it.
    n_ref = len(by["plain-torch"])
    share = nb * recompute[0] / n_ref / t_ref if n_ref else math.nan
    print(f"\nthe plain-torch path's second computation of the tree rows: {1e3 * recompute[0] / max(n_ref, 1):.1f} ms "
          f"per branched step, {100 * share:.1f}% of a run on that path")  # fmt: skip
    print(f"the kernel's tokens/s gain over the plain-torch path on this workload: {100 * gain:+.1f}% "
          f"(± {100 * se_gain:.1f}%)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
