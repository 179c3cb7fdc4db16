"""Verifying a step's scheduled trees: each request's output tokens written over vLLM's linear-chain result, the
accepted nodes' KV moved to the consecutive slots vLLM expects, and the requests' states advanced.

Greedy requests accept the longest path the target's argmax goes through; sampled ones follow the target's own
draws along the tree (`target_dist.draw_at`: vLLM's sampler at x0, the same distribution below it; on a GPU every
node's draw at once, `target_dist.draw_trees`). The window always advances with the argmax. The output rows and the
KV moves are two of the engine's three writes into vLLM's data. Nothing here waits for the GPU more than a few times a
step, however many trees and nodes: the rows' argmax and top tokens come back in one copy, the sampled trees' draws
in another, the output rows go up in one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vllm_lookahead.backends.logit_rows import LogitRows, Picks
from vllm_lookahead.backends.staging import to_device
from vllm_lookahead.core.tree import StepTree
from vllm_lookahead.core.verify import draw_verify, greedy_verify
from vllm_lookahead.glue.recycling import RecyclingGate
from vllm_lookahead.glue.requests import Requests
from vllm_lookahead.glue.stats import SOURCE_NAMES, LookaheadStats
from vllm_lookahead.glue.step import LookaheadStep, ScheduledTree, StepResult
from vllm_lookahead.glue.target_dist import TreeDraws, draw_at, draw_trees, is_greedy

if TYPE_CHECKING:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner


@dataclass
class Verified:
    """One request's verification: the target's argmax (and top tokens, where recycling reads them) at its nodes, the
    accepted nodes and the output tokens."""

    scheduled: ScheduledTree
    picks: Picks
    accepted: list[int]
    tokens: list[int]
    greedy: bool


class Verification:
    """What a step's verification changes besides vLLM's data: the requests' states, token recycling's table (through
    its gate) and the engine's counters."""

    def __init__(self, requests: Requests, recycling: RecyclingGate, stats: LookaheadStats) -> None:
        self.requests = requests
        self.recycling = recycling
        self.stats = stats

    def verify(
        self, runner: GPUModelRunner, step: LookaheadStep, result: StepResult, layers: Sequence[Any]
    ) -> dict[int, list[int]]:
        """Verify every scheduled tree of the step, write the outputs, move the KV in `layers` (the attention layers),
        update the states. Returns each verified request's path (input batch index -> tree nodes of its output
        tokens, root first)."""
        if result.spec_md is None or not (step.scheduled or result.x0_is_argmax):
            return {}
        verified, every = self._verify_trees(runner, step, result)
        _write_outputs(result, verified, every)
        paths = {v.scheduled.req_index: [0, *v.accepted] for v in verified}
        for v in verified:
            self._update(v)
        src, dst = _kv_moves(runner, verified)
        if src:
            step.backend.relocate(layers, src, dst)
        return paths

    def _verify_trees(
        self, runner: GPUModelRunner, step: LookaheadStep, result: StepResult
    ) -> tuple[list[Verified], list[int] | None]:
        """Each scheduled tree verified; and, where every x0's draw is its argmax, every row's argmax."""
        row0 = result.first_rows
        spans = [(row0[s.req_index], s.tree.num_nodes) for s in step.scheduled]
        k = self.recycling.top_k() if any(self._recycles(s) for s in step.scheduled) else 0
        logit_rows = step.backend.logit_rows
        every, picks = _read_rows(logit_rows, result.logits, spans, result.x0_is_argmax, k)
        batch = runner.input_batch
        greedy = [is_greedy(batch, s.req_index) for s in step.scheduled]
        sampled = [s for s, g in zip(step.scheduled, greedy, strict=True) if not g]
        draws = _Draws(runner, result, logit_rows.on_device, sampled)
        verified: list[Verified] = []
        for s, tree_picks, g in zip(step.scheduled, picks, greedy, strict=True):
            if g:
                accepted, tokens = greedy_verify(s.tree, tree_picks.argmax)
            else:
                accepted, tokens = draws.verify(s)
            verified.append(Verified(s, tree_picks, accepted, tokens, g))
        return verified, every

    def _recycles(self, s: ScheduledTree) -> bool:
        state = self.requests.states.get(s.req_id)
        return state is not None and state.recycle is not None

    def _update(self, v: Verified) -> None:
        s = v.scheduled
        stats = self.stats
        state = self.requests.states.get(s.req_id)
        if state is not None:
            # token recycling learns the target's top tokens along the verified path: x0 and the accepted nodes
            tops = v.picks.top
            top = None if tops is None or state.recycle is None else [tops[u] for u in (0, *v.accepted)]
            state.update(s.tree, v.picks.argmax, v.tokens, top)
        if s.ours and state is not None:
            # The nodes' rates are learned by the state in hindsight, over its whole tree; the window's worth and the
            # carried nodes' calibration here.
            state.stats.observe_window(s.tree, v.accepted)
            state.stats.observe_carried(s.tree, v.accepted)
            _count_sources(stats, s.tree, v.accepted)
        stats.tree_steps += 1
        stats.accepted += len(v.tokens) - 1
        if not v.greedy:
            stats.sampled_accepted += len(v.tokens) - 1


def _read_rows(
    logit_rows: LogitRows, logits: torch.Tensor, spans: list[tuple[int, int]], every_row: bool, k: int
) -> tuple[list[int] | None, list[Picks]]:
    """One pass over the logits rows verification reads: each (first row, rows) span's argmax and, where k > 0, its
    top k tokens. Only the spans' rows (at a large batch most requests carry no tree: their rows are not read), or
    every row where `every_row` (each x0's draw is its argmax), whose argmax is returned too."""
    rows = None if every_row else [r for first, n in spans for r in range(first, first + n)]
    picks = logit_rows.pick(logits, rows, k)
    starts = [first for first, _ in spans] if every_row else list(accumulate((n for _, n in spans), initial=0))
    top = picks.top
    per_span = [
        Picks(picks.argmax[a : a + n], None if top is None else top[a : a + n])
        for a, (_, n) in zip(starts, spans, strict=False)
    ]
    return (picks.argmax if every_row else None), per_span


class _Draws:
    """The step's sampled trees walked along the target's own draws: drawn at the nodes each walk visits where
    reading a draw is free (a host), or all at once and read back in one copy (`on_device`: a GPU;
    `target_dist.draw_trees`)."""

    def __init__(self, runner: GPUModelRunner, result: StepResult, on_device: bool, trees: list[ScheduledTree]):
        self.runner, self.result, self.index = runner, result, {s.req_id: i for i, s in enumerate(trees)}
        x0 = result.sampler_output.sampled_token_ids[:, 0] if result.first_rows_sampled else None
        self.batched: TreeDraws | None = None
        self.x0: list[int] | None = None
        if not trees:
            return
        if on_device:
            spans = [(s.req_index, result.first_rows[s.req_index], s.tree) for s in trees]
            self.batched = draw_trees(runner.sampler, runner.input_batch, result.logits, spans, x0)
        elif x0 is not None:
            self.x0 = x0.tolist()

    def verify(self, s: ScheduledTree) -> tuple[list[int], list[int]]:
        """A sampled tree's accepted nodes and output tokens."""
        if self.batched is not None:
            i = self.index[s.req_id]
            accepted, tokens = draw_verify(s.tree, self.batched.draws[i].__getitem__)
            self.batched.consumed(i, len(tokens))
            return accepted, tokens
        first_row = self.result.first_rows[s.req_index]
        rows = self.result.logits[first_row : first_row + s.tree.num_nodes]
        first = None if self.x0 is None else self.x0[s.req_index]
        md = self.runner.input_batch.sampling_metadata
        return draw_verify(s.tree, partial(draw_at, self.runner.sampler, md, s.req_index, rows, first))


def _write_outputs(result: StepResult, verified: list[Verified], every: list[int] | None) -> None:
    """Each verified request's output row (its tokens, then -1) written over vLLM's result; where every x0's draw is
    its argmax (`every`: every row's), every request's row, its x0 token first. One upload and one scatter."""
    sampled = result.sampler_output.sampled_token_ids
    num_reqs, width = sampled.shape
    if every is not None:
        reqs = list(range(num_reqs))
        out = np.full((num_reqs, width + 1), -1, dtype=np.int64)
        out[:, 1] = [every[r] for r in result.first_rows]
    else:
        reqs = [v.scheduled.req_index for v in verified]
        out = np.full((len(reqs), width + 1), -1, dtype=np.int64)
    out[:, 0] = reqs
    at = {r: i for i, r in enumerate(reqs)}
    for v in verified:
        row = out[at[v.scheduled.req_index]]
        row[1:] = -1
        row[1 : 1 + len(v.tokens)] = v.tokens
    if len(out):
        both = to_device(out.reshape(-1), torch.int64, sampled.device).view(len(out), width + 1)
        sampled.index_copy_(0, both[:, 0], both[:, 1:].to(sampled.dtype))


def _kv_moves(runner: GPUModelRunner, verified: list[Verified]) -> tuple[list[int], list[int]]:
    """The KV cache slots each accepted node's KV moves from and to: node u sits at the slot of position P+u, and
    vLLM expects depth d at P+d."""
    table = runner.input_batch.block_table[0]
    blocks, block_size = table.get_cpu_tensor().numpy(), table.block_size
    src: list[int] = []
    dst: list[int] = []
    for v in verified:
        s = v.scheduled
        for d, u in enumerate(v.accepted, start=1):
            if u != d:
                src.append(_slot(blocks, block_size, s.req_index, s.prefix_len + u))
                dst.append(_slot(blocks, block_size, s.req_index, s.prefix_len + d))
    return src, dst


def _slot(blocks: np.ndarray, block_size: int, req_index: int, position: int) -> int:
    """The KV cache slot of a request's token position, as vLLM's slot mapping computes it from the block table."""
    return int(blocks[req_index, position // block_size]) * block_size + position % block_size


def _count_sources(stats: LookaheadStats, tree: StepTree, accepted: list[int]) -> None:
    stats.carried_score += sum(tree.scores[1:])
    sources = tree.sources
    for u in range(1, tree.num_nodes):
        stats.drafted[SOURCE_NAMES[sources[u] - 1]] += 1
    for u in accepted:
        stats.accepted_by[SOURCE_NAMES[sources[u] - 1]] += 1
