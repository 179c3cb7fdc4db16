"""The tree sizing's bar against a scaled one, step by step: one engine whose every other step sizes its trees as if a
draft token cost `--scale` times what the fitted step cost says.

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/ab_sizing.py --concurrency 16 --scale 0.5

Whether the sizing takes too few or too many nodes cannot be read from two whole runs on this machine: one code's
runs move by up to 20% between rounds (`bench_methods.py --methods lookahead,lookahead-twin`). Here one in-process
engine (VLLM_ENABLE_V1_MULTIPROCESSING=0, eager, greedy unless `--temperature`, batch `--concurrency`) generates
`--num-prompts` prompts of the set after a warm-up on other prompts of it, and the drafting after every other step
prices a draft token at `--scale` times the fit's (`sizing.plan_step`, `sizing.choose_sizes` and
`sizing.score_floor` get a frozen copy of the fit with both token prices scaled; the fit itself learns from every
step). Each decoding step is timed as the engine's step-cost fit times it (`sizing.StepTimer`: from its start to the
start of the next step, an idle gap left out), its own drafting (which builds the next step's trees, under the other
bar) swapped for the drafting that built its trees (`charged`), and credited to the bar its trees were sized under,
with the tokens it made (its requests plus the drafts they accepted). Both halves see the same minutes of the
machine and the same requests, so the tokens/s of the two bars compare within a few percent. Prints per bar: steps,
draft tokens and tokens a request-step, tokens/s over its own steps, and the scaled bar's tokens/s over the fit's;
then the carried draft nodes' accepted count against their summed scores (how far the scores of the nodes the sizing
picks overstate them: the worker's `carried_score`). The script wraps the engine from outside: the plugin carries no
code for it. Greedy outputs stay exact under either bar.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

from _inprocess import (  # the scripts run from benchmarks/, which is on sys.path
    add_common_args,
    add_sampling_args,
    sampling_label,
    timed_generate,
)
from _inprocess import engine as in_process_engine


def positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return v


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, dtype="bfloat16", dataset="sharegpt", num_prompts=48, max_tokens=96)
    add_sampling_args(p)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--scale", type=positive, default=0.5, help="the other bar's price of a draft token, times the fit's"
    )
    return p.parse_args(argv)


@dataclass
class Tally:
    """One bar's decoding steps: their count, requests, drafts, tokens made and seconds."""

    steps: int = 0
    requests: int = 0
    drafts: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, requests: int, drafts: int, tokens: int, seconds: float) -> None:
        self.steps += 1
        self.requests += requests
        self.drafts += drafts
        self.tokens += tokens
        self.seconds += seconds

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class Alternation:
    """Which bar the next trees are sized under (arm 0: the fit's, arm 1: the scaled one), and each arm's tally of
    the steps that ran them. The arms are kept apart even at `--scale 1`, an A/A control of the method itself."""

    scale: float
    proposals: int = 0  # drafting calls so far: odd ones use the scaled bar
    tallies: tuple[Tally, Tally] = field(default_factory=lambda: (Tally(), Tally()))

    def arm(self) -> int:
        """The arm of the drafting now under way."""
        return self.proposals % 2

    def factor(self, arm: int) -> float:
        """The arm's price of a draft token, times the fit's."""
        return self.scale if arm else 1.0

    def credit(self, arm: int, requests: int, drafts: int, tokens: int, seconds: float) -> None:
        self.tallies[arm].add(requests, drafts, tokens, seconds)


def scaled(cost, factor: float):  # noqa: ANN001, ANN201
    """A frozen copy of a StepCost's current fit with both prices of a draft token times factor."""
    from vllm_lookahead.core.sizing import StepCost

    m = cost.coefficients()
    return StepCost.frozen(m._replace(per_draft=m.per_draft * factor, per_draft_below=m.per_draft_below * factor))


def charged(measured: float, own_drafting: float, built_by: float) -> float:
    """A step's seconds as its bar is charged them: as the step-cost fit times it (from its start through the
    drafting at its end to the next step's start), less that drafting (it builds the next step's trees, sized
    under the other bar), plus the drafting that built its own trees. Without the swap, a step of a bar that drafts
    little would carry the other bar's drafting and the other its cheap one."""
    return measured - own_drafting + built_by


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from vllm_lookahead.core.sizing import StepTimer
    from vllm_lookahead.glue import engine

    ab = Alternation(args.scale)
    timing = {"on": False}
    timer = StepTimer()  # times each decoding step as the engine's own step-cost fit does
    # the decoding step under way: requests, drafts, the engine's accepted count before it, the bar its trees were
    # sized under, the seconds of the drafting that built them; then the tokens it made
    open_step: dict[str, object] = {}
    drafting = [0.0]  # the seconds of the last drafting: at a step's start, what built its trees; at the next, its own
    plan, choose, floor = engine.plan_step, engine.choose_sizes, engine.score_floor

    def plan_step(trees, caps, requests, cost, budget):  # noqa: ANN001, ANN202
        return plan(trees, caps, requests, scaled(cost, ab.factor(ab.arm())), budget)

    def choose_sizes(trees, caps, requests, cost, budget, branched=False):  # noqa: ANN001, ANN202
        return choose(trees, caps, requests, scaled(cost, ab.factor(ab.arm())), budget, branched)

    def score_floor(cost, requests):  # noqa: ANN001, ANN202
        return floor(scaled(cost, ab.factor(ab.arm())), requests)

    begin, propose = engine.LookaheadEngine.begin_step, engine.LookaheadEngine.propose

    def begin_step(self, runner, scheduler_output):  # noqa: ANN001, ANN202
        now = time.perf_counter()
        last = dict(open_step)
        open_step.clear()
        spec = scheduler_output.scheduled_spec_decode_tokens
        requests = runner.input_batch.num_reqs
        drafts = sum(len(d) for d in spec.values())
        pure = scheduler_output.total_num_scheduled_tokens == requests + drafts  # a pure decoding step
        done = timer.begin(now, requests, drafts if pure else None)
        if timing["on"] and done is not None and "tokens" in last:
            seconds = charged(done[3], drafting[0], last["built_by"])
            ab.credit(last["arm"], last["requests"], last["drafts"], last["tokens"], seconds)
        if pure:
            arm = getattr(self, "_ab_arm", 0)
            open_step.update(
                requests=requests, drafts=drafts, accepted=self.stats.accepted, arm=arm, built_by=drafting[0]
            )
        return begin(self, runner, scheduler_output)

    carried: dict[str, object] = {}  # the engine, and its carried-node totals when timing started

    def carried_totals(eng) -> tuple[float, int]:  # noqa: ANN001
        st = eng.stats
        return st.carried_score, sum(st.accepted_by.values())

    def propose_(self, runner, sampled):  # noqa: ANN001, ANN202
        carried["engine"] = self
        if timing["on"] and "start" not in carried:
            carried["start"] = carried_totals(self)
        if open_step:
            # the tokens this step made: its verification ran before this hook
            open_step["tokens"] = open_step["requests"] + self.stats.accepted - open_step["accepted"]
        self._ab_arm = ab.arm()  # the bar the trees drafted now are sized under, read when they run
        t0 = time.perf_counter()
        try:
            return propose(self, runner, sampled)
        finally:
            ab.proposals += 1
            now = time.perf_counter()
            timer.end(now)
            drafting[0] = now - t0

    engine.plan_step, engine.choose_sizes, engine.score_floor = plan_step, choose_sizes, score_floor
    engine.LookaheadEngine.begin_step = begin_step
    engine.LookaheadEngine.propose = propose_

    llm = in_process_engine(args, args.concurrency)
    _, seconds, tokens = timed_generate(llm, args, args.concurrency, lambda: timing.update(on=True))

    print(f"\n{args.dataset}, {args.dtype}, {sampling_label(args)}, concurrency {args.concurrency}: {tokens} tokens "
          f"in {seconds:.1f} s "
          f"({tokens / seconds:.1f} tokens/s), every other step's trees sized at {args.scale}x the fitted price "
          "of a draft token\n")  # fmt: skip
    print("| bar | decoding steps | draft tokens a request-step | tokens a request-step | tokens/s over its steps |")
    print("|---|---|---|---|---|")
    for arm, t in enumerate(ab.tallies):
        r = max(t.requests, 1)
        name = "fit" if arm == 0 else "scaled"
        print(f"| {ab.factor(arm):g}x ({name}) | {t.steps} | {t.drafts / r:.2f} | {t.tokens / r:.2f} | {t.rate:.1f} |")
    base, other = ab.tallies
    print(f"\n{args.scale:g}x the price over the fit's price, tokens/s of their steps: {other.rate / base.rate:.3f}")
    if "start" in carried:
        now = carried_totals(carried["engine"])
        score, accepted = (b - a for a, b in zip(carried["start"], now, strict=True))
        print(f"carried draft nodes, both bars: {accepted} accepted, their scores summed to {score:.1f} "
              f"(accepted / scores: {accepted / max(score, 1e-9):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
