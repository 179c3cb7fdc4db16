"""Drafting: each lookahead request's next tree, sized by what the engine's own steps cost.

The trees come from the requests' states (`core.state`); how many nodes each step carries from the step-cost fit
(`core.sizing`), which learns from the engine's own decoding steps timed here (`StepTimer`): small trees where tokens
are dear (a CPU, a large batch), large ones where they are nearly free, none where nothing is likely enough. Where
the backend runs no trees (the chain backend), each request carries its best branch.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from vllm_lookahead.backends import TreeBackend
from vllm_lookahead.core.cost import StepCost
from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.core.sizing import choose_sizes, plan_step, score_floor
from vllm_lookahead.core.state import LookaheadState
from vllm_lookahead.core.step_timer import COLD_STEPS, StepTimer
from vllm_lookahead.core.tree import StepTree
from vllm_lookahead.glue.recycling import RecyclingGate
from vllm_lookahead.glue.requests import Requests
from vllm_lookahead.glue.step import LookaheadStep

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner


class Drafting:
    def __init__(
        self,
        params: LookaheadParams,
        max_model_len: int,
        ranks: int,
        backend: TreeBackend,
        recycling: RecyclingGate,
    ) -> None:
        self.params = params
        self.max_model_len = max_model_len
        # Under tensor parallelism every rank must build the same trees, but each sizes them from its own step
        # timings: there the trees are built whole and only cut to the driver's scheduled drafts.
        self.ranks = ranks
        self.backend = backend
        self.recycling = recycling
        self.cost = StepCost(params.node_cost)
        # Pure decoding steps timed for the fit, from begin_step to the next one (the engine's work between included),
        # the engine's first few left out (first-use costs).
        self.timer = StepTimer(COLD_STEPS)

    def time_step(self, runner: GPUModelRunner, scheduler_output: SchedulerOutput) -> None:
        """A step starts: the step before it, if it was a pure decoding step (every request computes x0 and its
        drafts), is complete and feeds the fit."""
        spec = scheduler_output.scheduled_spec_decode_tokens
        tokens = scheduler_output.total_num_scheduled_tokens
        requests = runner.input_batch.num_reqs
        decoding = tokens == requests + sum(len(d) for d in spec.values())
        timed = self.timer.begin(time.perf_counter(), requests, tokens - requests if decoding else None)
        if timed is not None:
            self.cost.observe(*timed)

    def propose(
        self, runner: GPUModelRunner, sampled_token_ids: list[list[int]], requests: Requests, step: LookaheadStep
    ) -> list[list[int]]:
        """Next step's drafts per request (input batch order): each tree's best nodes after the root x0, as many as
        the fitted step cost says pay (`sizing.plan_step`); the trees go into `step`. Ends a decoding step's own span,
        drafting included; the fit learns it with the engine's work until the next step (`StepTimer`)."""
        try:
            return self._draft(runner, sampled_token_ids, requests, step)
        finally:
            self.timer.end(time.perf_counter())

    def _draft(
        self, runner: GPUModelRunner, sampled_token_ids: list[list[int]], requests: Requests, step: LookaheadStep
    ) -> list[list[int]]:
        batch = runner.input_batch
        drafts: list[list[int]] = [[] for _ in batch.req_ids]
        rows: list[tuple[int, str]] = []
        ready: list[tuple[LookaheadState, int]] = []
        caps: list[int] = []
        for i, req_id in enumerate(batch.req_ids):
            sampled = sampled_token_ids[i] if i < len(sampled_token_ids) else []
            if not sampled or requests.rests.resting(req_id):
                continue  # a resting request's state catches up when it next builds a tree (`resting.py`)
            if not requests.eligible(runner, req_id) or _unseen_prefill(requests, batch, i, req_id):
                continue
            room = self._room(runner, i, req_id)
            if room <= 0:
                continue
            state = requests.state(runner, i, req_id)
            rows.append((i, req_id))
            ready.append((state, int(sampled[-1])))
            caps.append(room + 1)
        budget = self.params.step_token_budget - len(ready)
        if not ready or budget <= 0 or _prefilling(sampled_token_ids, batch.num_reqs):
            return drafts  # no room for a single draft token this step: the states have learned, nothing to build
        trees, sizes = self.plan(ready, caps, batch.num_reqs, budget)
        for (i, req_id), tree, size in zip(rows, trees, sizes, strict=True):
            # The whole tree is kept and vLLM gets its first `size` nodes: scheduling cuts the tree to what was
            # scheduled. Under tensor parallelism every rank builds the same tree from the same state, but only the
            # driver's drafts are scheduled and the sizes follow each rank's own step timings; so every rank cuts
            # the same tree at the driver's size. Under two nodes there is nothing to draft: the request decodes
            # plainly this step (large batches, where tokens are dear, and requests whose candidates are unlikely).
            step.proposed[req_id] = tree
            if size > 1:
                drafts[i] = tree.tokens[1:size]
            requests.rests.built(req_id, carried=size > 1)
        return drafts

    def plan(
        self, ready: list[tuple[LookaheadState, int]], caps: list[int], num_reqs: int, budget: int
    ) -> tuple[list[StepTree], list[int]]:
        """Each ready (state, x0)'s tree and how many of its nodes (root included) the step carries: caps[i] nodes at
        most, `budget` draft tokens in all, in a step of `num_reqs` decoding requests. No vLLM here: the replay of
        recorded outputs (`benchmarks/research/replay_trees.py`) drafts through it too."""
        # Nodes the sizing below would never take are not drafted (large batches on a CPU: most of them).
        floor = score_floor(self.cost, num_reqs) if self.ranks == 1 else 0.0
        self.recycling.decide(floor, [state.stats for state, _ in ready])
        # A score is worth its request's calibration: the nodes steps carried were accepted at that per unit of score.
        scales = [state.stats.calibration for state, _ in ready]
        trees = [state.build_tree(x0, min_score=floor / s) for (state, x0), s in zip(ready, scales, strict=True)]
        if not self.backend.trees:  # no tree attention here: each request's best chain
            trees = [t.best_chain() for t in trees]
        if self.ranks == 1:
            # Where the tree attention path costs more than its branches bring, each request's best chain alone.
            return plan_step(trees, caps, num_reqs, self.cost, budget, scales)
        return trees, choose_sizes([t.scores for t in trees], caps, num_reqs, self.cost, budget, scales=scales).sizes

    def _room(self, runner: GPUModelRunner, index: int, req_id: str) -> int:
        """Draft tokens after x0 that can count: within max_model_len's positions, and within the request's
        max_tokens. A step emits its accepted drafts and one token more, so a draft past the request's last token
        would be computed for nothing (vLLM's scheduler cuts drafts at max_model_len only)."""
        batch = runner.input_batch
        n = int(batch.num_tokens_no_spec[index])
        room = self.max_model_len - n
        sp = runner.requests[req_id].sampling_params
        if sp is not None and sp.max_tokens is not None:
            room = min(room, int(batch.num_prompt_tokens[index]) + sp.max_tokens - n - 1)
        return room


def _prefilling(sampled_token_ids: list[list[int]], num_reqs: int) -> bool:
    """Whether a request of the step just run sampled nothing: its prompt is being prefilled in chunks, so the
    scheduler's token budget ran out on prompts. Every draft token scheduled next step would then displace a prompt
    token, one for one, and delay the waiting requests' first tokens: no drafts until the prompts are in."""
    return any(not sampled_token_ids[i] for i in range(min(num_reqs, len(sampled_token_ids))))


def _unseen_prefill(requests: Requests, batch: InputBatch, index: int, req_id: str) -> bool:
    """Whether the request has only just sampled its first token and has no state yet. Its state (the prompt
    indexed for lookup, the pool seeded, its suffix tree: work in proportion to the prompt) is built at its next step
    instead, so that its first token goes out without waiting for it; the request drafts from its third step on."""
    return (
        req_id not in requests.states
        and int(batch.num_tokens_no_spec[index]) - int(batch.num_prompt_tokens[index]) <= 1
    )
