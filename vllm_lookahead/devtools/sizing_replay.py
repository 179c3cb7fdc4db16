"""The tree sizing replayed against the step-cost curves of machines we may not have, on recorded greedy outputs.

Greedy decoding is deterministic, so a lookahead run on known outputs replays exactly without the model: each step
builds the requests' trees from the engine's own states and statistics, verifies them against the known
continuation and updates the states as the engine does. What a step costs comes from a measured curve
(`Curve`: milliseconds against the tokens a step computes, per request count). Three kinds of policy are replayed:

- `"sized"`: the engine's own sizing (`glue.drafting.Drafting.plan`), its step cost seeded as the engine seeds it at
  start-up (the curve's forward passes at 1, 2, 4, ... tokens) and then learning from every step it is charged (the
  curve plus the engine's own work, with noise), its first COLD_STEPS left out as the engine leaves them out;
- an int k > 0: every request carries its k best-scored draft nodes each step (a fixed tree size);
- 0: plain decoding.

`replay` runs `concurrency` requests at a time (waves: all admitted together, the next wave when all are done) and
returns each step's tokens and seconds, so that tokens per second can be read over the whole run and over its first
steps. The fixed sizes' decisions do not depend on the curve, so one trace of them is priced under every curve
(`Trace.seconds`).
"""

from __future__ import annotations

import gzip
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NOISE = 0.03  # the spread of what a timed step costs around the curve (log-normal sigma)
# The plugin's own host work (drafting, verification, the state updates) in a step where requests build trees, as
# timed on the 2-core AMX host at 1 and 4 requests: a step's share and each building request's. Plain decoding pays
# none. `replay(plugin=True)` charges it to lookahead's steps (the same seconds on every machine: the host's Python).
PLUGIN_STEP = 0.0005
PLUGIN_REQUEST = 0.0004
SIZED = "sized"


@dataclass(frozen=True)
class Curve:
    """Milliseconds of a forward pass against the tokens it computes, per request count (`rows`: R -> (T, ms) points,
    ascending). Between rows prices are linear in R; past the last row, or below the first, each request more adds
    `per_request` times a one-token pass. Within a row, linear in T; past its last point, rising as the next row that
    reaches there rises, or else along its last slope."""

    name: str
    rows: dict[int, tuple[tuple[float, float], ...]]
    per_request: float = 0.0
    machine: str = ""
    dtype: str = ""
    engine_ms: float = 0.0  # the engine's own work a step beyond the rows' forward (0 where the rows hold it)

    @property
    def one(self) -> float:
        return self._row(min(self.rows), 1.0)

    def _row(self, r: int, tokens: float) -> float:
        pts = self.rows[r]
        if tokens <= pts[0][0]:
            return pts[0][1]
        for (t0, s0), (t1, s1) in zip(pts, pts[1:], strict=False):
            if tokens <= t1:
                return s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)
        last_t, last_s = pts[-1]
        # past the row: as a row of more requests measured there rises (a token costs the same whoever's it is)
        for other in sorted(q for q in self.rows if q > r and self.rows[q][-1][0] >= tokens):
            return last_s + self._row(other, tokens) - self._row(other, max(last_t, self.rows[other][0][0]))
        (t0, s0) = pts[-2]
        return last_s + (last_s - s0) * (tokens - last_t) / (last_t - t0)

    def forward(self, requests: int, tokens: float) -> float:
        """Seconds of a forward pass of `requests` requests computing `tokens` tokens."""
        rs = sorted(self.rows)
        below = [r for r in rs if r <= requests]
        above = [r for r in rs if r >= requests]
        if below and above:
            lo, hi = below[-1], above[0]
            a = self._row(lo, tokens)
            ms = a if hi == lo else a + (self._row(hi, tokens) - a) * (requests - lo) / (hi - lo)
        else:
            r = below[-1] if below else above[0]
            ms = self._row(r, tokens) + self.per_request * self.one * (requests - r)
        return ms / 1e3

    def step(self, requests: int, tokens: float) -> float:
        """Seconds of an engine step: the forward pass and the engine's own work (`engine_ms`)."""
        return self.forward(requests, tokens) + self.engine_ms / 1e3


def load_curves(path: Path) -> list[Curve]:
    data = json.loads(Path(path).read_text())
    return [
        Curve(
            c["name"],
            {int(r): tuple((float(t), float(ms)) for t, ms in pts) for r, pts in c["rows"].items()},
            float(c.get("per_request", 0.0)),
            c.get("machine", ""),
            c.get("dtype", ""),
            float(c.get("engine_ms", 0.0)),
        )
        for c in data["curves"]
    ]


def load_sequences(path: Path) -> dict[str, list[tuple[list[int], list[int], list[list[int]]]]]:
    """Recorded greedy runs per prompt set: (prompt, output, the target's top tokens at each output position)."""
    raw = gzip.decompress(Path(path).read_bytes()) if str(path).endswith(".gz") else Path(path).read_bytes()
    return {k: [tuple(r) for r in v] for k, v in json.loads(raw).items()}


@dataclass
class Trace:
    """A replayed run, step by step: the decoding requests, the tokens computed, whether a tree branched, and the
    tokens the step emitted."""

    requests: list[int] = field(default_factory=list)
    computed: list[int] = field(default_factory=list)
    branched: list[bool] = field(default_factory=list)
    emitted: list[int] = field(default_factory=list)
    plugin: list[float] = field(default_factory=list)  # the plugin's own seconds in the step (lookahead's policies)
    limit: int | None = None  # the most steps it holds

    @property
    def full(self) -> bool:
        return self.limit is not None and len(self.emitted) >= self.limit

    def add(self, requests: int, computed: int, branched: bool, emitted: int, plugin: float = 0.0) -> None:
        self.requests.append(requests)
        self.computed.append(computed)
        self.branched.append(branched)
        self.emitted.append(emitted)
        self.plugin.append(plugin)

    def seconds(self, curve: Curve) -> list[float]:
        return [curve.step(r, t) + p for r, t, p in zip(self.requests, self.computed, self.plugin, strict=True)]

    def rate(self, curve: Curve, steps: int | None = None) -> float:
        """Tokens per second over the first `steps` steps (all by default)."""
        n = len(self.emitted) if steps is None else min(steps, len(self.emitted))
        return sum(self.emitted[:n]) / sum(self.seconds(curve)[:n])


def verify_known(tree: Any, known: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """Greedy verification of a tree against the output's known continuation `known`: (the target's argmax at each
    node where the output says it, 0 elsewhere; the accepted nodes; the new tokens, cut where the output ends)."""
    from vllm_lookahead.core.verify import greedy_verify

    on, _ = tree.follow(known)
    # the target's argmax where it is known (the true path); elsewhere a token no draft has
    argmax = [known[tree.depths[u]] if u in on and tree.depths[u] < len(known) else -1 for u in range(tree.num_nodes)]
    accepted, new = greedy_verify(tree, argmax)
    return [max(a, 0) for a in argmax], accepted, new[: len(known)]


def replay(
    requests: Sequence[tuple[Sequence[int], Sequence[int], Sequence[Sequence[int]]]],
    params: Any,
    concurrency: int,
    policy: int | str,
    curve: Curve | None = None,
    warm_up: Sequence[tuple[Sequence[int], Sequence[int], Sequence[Sequence[int]]]] = (),
    seed: int = 0,
    steps: int | None = None,
    plugin: bool = False,
) -> Trace:
    """`policy` (module docstring) replayed on `requests` (prompt, output, tops), `concurrency` at a time, after the
    `warm_up` requests one at a time (their steps not in the trace; they teach the statistics, as a benchmark's
    warm-up does). The sized policy needs the `curve` it is charged by, and meets the counted requests with a fresh
    step cost (the start-up seed alone); `seed` draws its noise. `steps`: stop after so many counted steps. `plugin`:
    lookahead's steps also cost the plugin's own host work (PLUGIN_STEP, PLUGIN_REQUEST), which its sizing then
    sees in every step it times."""
    if policy == 0:
        return _plain(requests, concurrency, steps)
    from vllm_lookahead.core.acceptance import AcceptanceStats
    from vllm_lookahead.core.recycle import TokenRecycler
    from vllm_lookahead.core.suffix import SuffixCandidates
    from vllm_lookahead.glue.drafting import Drafting
    from vllm_lookahead.glue.recycling import RecyclingGate
    from vllm_lookahead.glue.resting import Rests

    if policy == SIZED and curve is None:
        raise ValueError("the sized policy needs the curve its steps are charged by")
    run = _Run(
        params,
        policy,
        curve,
        random.Random(seed),
        AcceptanceStats(),
        SuffixCandidates.create(params.suffix_depth, params.suffix_cache_requests)
        if params.suffix_candidates
        else None,
        TokenRecycler() if params.recycle_candidates else None,
        concurrency,
        plugin,
    )
    run.drafting = Drafting(params, 1 << 30, 1, _Trees(), RecyclingGate(run.recycle))
    run.rests = Rests()
    run.serve([_Slot(-1 - i, *r) for i, r in enumerate(warm_up)], 1, None)
    run.fresh_cost()
    trace = Trace(limit=steps)
    run.serve([_Slot(rid, *r) for rid, r in enumerate(requests)], concurrency, trace)
    return trace


@dataclass
class _Run:
    """One replayed engine: its policy, shared statistics and caches, drafting and step cost."""

    params: Any
    policy: int | str
    curve: Curve | None
    rng: random.Random
    stats: Any
    suffix: Any
    recycle: Any
    concurrency: int = 1
    plugin: bool = False  # lookahead's steps pay the plugin's own host work
    drafting: Any = None
    rests: Any = None
    cold: int = 0  # timed steps still to leave out of the step cost

    def fresh_cost(self) -> None:
        """A step cost as the engine starts with: the start-up seed of the curve's forward passes."""
        if self.policy != SIZED:
            return
        from vllm_lookahead.core.cost import StepCost
        from vllm_lookahead.core.step_timer import COLD_STEPS
        from vllm_lookahead.glue.seed_timing import BUDGET_SECONDS, seed_sizes, within_budget

        largest = self.concurrency + self.params.step_token_budget
        sizes = within_budget(seed_sizes(largest), lambda t: self.curve.forward(1, t), BUDGET_SECONDS)
        self.drafting.cost = cost = StepCost()
        cost.seed(sizes, [self.curve.forward(1, t) * _jitter(self.rng) for t in sizes])
        self.cold = COLD_STEPS

    def serve(self, queue: list[_Slot], concurrency: int, trace: Trace | None) -> None:
        """The requests of `queue`, `concurrency` in flight (a request joins in the step after one leaves, its
        prompt's token made), decoded until all are done or `trace` is full; the steps into `trace`. As in the engine,
        a request builds no tree at its first decoding step (its state is made then), and, where the plugin's own work
        is charged, under the sized policy a request whose trees carried nothing rests (`glue/resting.py`); its state
        learns the tokens it missed when it next builds one."""
        from vllm_lookahead.core.state import LookaheadState

        params, policy, curve = self.params, self.policy, self.curve
        waiting, active = list(queue), []
        while (waiting or active) and (trace is None or not trace.full):
            while waiting and len(active) < concurrency:
                s = waiting.pop(0)
                if len(s.made) >= len(s.output):
                    continue  # done with its prompt's token
                s.state = LookaheadState(
                    params, s.prompt, stats=self.stats, suffix=self.suffix, req_id=s.rid, recycle=self.recycle
                )
                active.append(s)
            # resting saves the plugin's own work: it is replayed where that work is charged
            resting = policy == SIZED and self.plugin
            building = [s for s in active if len(s.made) > 1 and not (resting and self.rests.resting(s.rid))]
            for s in building:
                s.state.catch_up(len(s.prompt) + len(s.made), s.fetch)
            ready = [(s.state, s.made[-1]) for s in building]
            caps = [len(s.output) - len(s.made) for s in building]  # the room up to the request's last token, + 1
            trees, sizes = [], []
            if building and policy == SIZED:
                trees, sizes = self.drafting.plan(ready, caps, len(active), params.step_token_budget - len(ready))
                for s, size in zip(building, sizes, strict=True):
                    self.rests.built(s.rid, carried=size > 1)
            elif building:
                trees = [st.build_tree(x0) for st, x0 in ready]
                sizes = [min(int(policy) + 1, t.num_nodes, c) for t, c in zip(trees, caps, strict=True)]
            emitted = drafts = 0
            branched = False
            for s, tree, size in zip(building, trees, sizes, strict=True):
                tree = tree.truncate(size)
                argmax, accepted, new = verify_known(tree, s.output[len(s.made) :])
                top = s.tops[len(s.made) : len(s.made) + len(new)] if s.tops else None
                s.state.update(tree, argmax, new, top)
                s.state.stats.observe_window(tree, accepted)
                s.state.stats.observe_carried(tree, accepted)
                s.made.extend(new)
                emitted += len(new)
                drafts += size - 1
                branched = branched or not tree.is_chain
            for s in active:
                if s not in building:
                    s.made.append(s.output[len(s.made)])
                    emitted += 1
            plugin = (PLUGIN_STEP + PLUGIN_REQUEST * len(building)) if building and self.plugin else 0.0
            if trace is not None:
                trace.add(len(active), len(active) + drafts, branched, emitted, plugin)
            if policy == SIZED:
                if self.cold > 0:
                    self.cold -= 1
                else:
                    seconds = (curve.step(len(active), len(active) + drafts) + plugin) * _jitter(self.rng)
                    self.drafting.cost.observe(len(active), drafts, branched, seconds)
            for s in [s for s in active if len(s.made) == len(s.output)]:
                s.state.close()
                if s.made != s.output:
                    raise AssertionError(f"replay of request {s.rid} differs from its output")
                active.remove(s)


def _plain(requests: Sequence[tuple[Sequence[int], Sequence[int], Any]], concurrency: int, steps: int | None) -> Trace:
    """Plain decoding's steps: a token a request each, `concurrency` in flight as `_Run.serve` keeps them."""
    trace = Trace(limit=steps)
    waiting = [len(r[1]) - 1 for r in requests if len(r[1]) > 1]  # tokens to decode after the prompt's
    active: list[int] = []
    while (waiting or active) and not trace.full:
        while waiting and len(active) < concurrency:
            active.append(waiting.pop(0))
        trace.add(len(active), len(active), False, len(active))
        active = [n - 1 for n in active if n > 1]
    return trace


def _jitter(rng: random.Random) -> float:
    return math.exp(rng.gauss(0.0, NOISE))


class _Trees:
    """The backend as drafting sees it: one that runs trees."""

    trees = True


@dataclass
class _Slot:
    rid: int
    prompt: list[int]
    output: list[int]
    tops: list[list[int]] | None = None
    made: list[int] = field(default_factory=list)
    state: Any = None

    def __post_init__(self) -> None:
        self.prompt, self.output = list(self.prompt), list(self.output)
        self.made = [self.output[0]]  # the prefill's token

    def fetch(self, a: int, b: int) -> list[int]:
        """The sequence's tokens a..b-1 (prompt, then what was made)."""
        return [*self.prompt, *self.made][a:b]
