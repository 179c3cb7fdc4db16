"""Verifying a step's scheduled trees: each request's output tokens written over vLLM's linear-chain result, the
accepted nodes' KV moved to the consecutive slots vLLM expects, and the requests' states advanced.

Greedy requests accept the longest path the target's argmax goes through; sampled ones follow the target's own
draws along the tree (`target_dist.draw_at`: vLLM's sampler at x0, the same distribution below it). The window always
advances with the argmax. The output rows and the KV moves are two of the engine's three writes into vLLM's data.
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
from vllm_lookahead.core.tree import StepTree
from vllm_lookahead.core.verify import draw_verify, greedy_verify
from vllm_lookahead.glue.recycling import RecyclingGate
from vllm_lookahead.glue.requests import Requests
from vllm_lookahead.glue.stats import SOURCE_NAMES, LookaheadStats
from vllm_lookahead.glue.step import LookaheadStep, ScheduledTree, StepResult
from vllm_lookahead.glue.target_dist import draw_at, is_greedy

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
        sampled = result.sampler_output.sampled_token_ids
        # Written through a numpy view, cheaper than torch operations a request on a CPU (on a GPU, a host copy
        # written back once).
        host = sampled if sampled.device.type == "cpu" else sampled.cpu()
        out_rows = host.numpy()
        verified = self._verify_trees(runner, step, result, out_rows)
        paths = {v.scheduled.req_index: [0, *v.accepted] for v in verified}
        for v in verified:
            self._update(v)
        if host is not sampled:
            sampled.copy_(host, non_blocking=True)
        src, dst = _kv_moves(runner, verified)
        if src:
            step.backend.relocate(layers, src, dst)
        return paths

    def _verify_trees(
        self, runner: GPUModelRunner, step: LookaheadStep, result: StepResult, out_rows: np.ndarray
    ) -> list[Verified]:
        """Each scheduled tree verified and its request's output row written (every request's x0 where it is the
        argmax)."""
        row0 = result.first_rows
        spans = [(row0[s.req_index], s.tree.num_nodes) for s in step.scheduled]
        k = self.recycling.top_k() if any(self._recycles(s) for s in step.scheduled) else 0
        every, picks = _read_rows(step.backend.logit_rows, result.logits, spans, result.x0_is_argmax, k)
        if every is not None:  # the x0 rows' argmax are the draws
            out_rows[:, 0] = [every[r] for r in row0]
        md = runner.input_batch.sampling_metadata
        verified: list[Verified] = []
        for s, tree_picks in zip(step.scheduled, picks, strict=True):
            greedy = is_greedy(md, s.req_index)
            if greedy:
                accepted, tokens = greedy_verify(s.tree, tree_picks.argmax)
            else:
                first_row = row0[s.req_index]
                first = int(out_rows[s.req_index, 0]) if result.first_rows_sampled else None
                rows = result.logits[first_row : first_row + s.tree.num_nodes]
                accepted, tokens = draw_verify(s.tree, partial(draw_at, runner.sampler, md, s.req_index, rows, first))
            out_rows[s.req_index] = -1
            out_rows[s.req_index, : len(tokens)] = tokens
            verified.append(Verified(s, tree_picks, accepted, tokens, greedy))
        return verified

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
