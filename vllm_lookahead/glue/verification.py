"""Verifying a step's scheduled trees: each request's output tokens written over vLLM's linear-chain result, the
accepted nodes' KV moved to the consecutive slots vLLM expects, and the requests' states advanced.

Greedy requests accept the longest path the target's argmax goes through; sampled ones follow the target's own
draws along the tree (`target_dist.draw_at`: vLLM's sampler at x0, the same distribution below it). The window always
advances with the argmax. The output rows and the KV moves are two of the engine's three writes into vLLM's data.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm_lookahead.core.tree import StepTree
from vllm_lookahead.core.verify import draw_verify, greedy_verify
from vllm_lookahead.glue.logit_rows import row_argmax
from vllm_lookahead.glue.recycling import RecyclingGate
from vllm_lookahead.glue.requests import Requests
from vllm_lookahead.glue.sampling import first_rows
from vllm_lookahead.glue.stats import SOURCE_NAMES, LookaheadStats
from vllm_lookahead.glue.step import LookaheadStep, ScheduledTree
from vllm_lookahead.glue.target_dist import draw_at, is_greedy

if TYPE_CHECKING:
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner


@dataclass
class Verified:
    """One request's verification: the target's argmax at its nodes, the accepted nodes and the output tokens."""

    scheduled: ScheduledTree
    argmax: list[int]
    accepted: list[int]
    tokens: list[int]
    greedy: bool


def verify_step(
    runner: GPUModelRunner,
    step: LookaheadStep,
    logits: torch.Tensor,
    spec_md: SpecDecodeMetadata,
    sampler_output: SamplerOutput,
    first_rows_sampled: bool,
    requests: Requests,
    recycling: RecyclingGate,
    stats: LookaheadStats,
    argmax: list[int] | None = None,
) -> dict[int, list[int]]:
    """Verify every scheduled tree of the step, write the outputs, move the KV, update the states.
    first_rows_sampled: column 0 of the sampler output holds vLLM's draw at each request's x0 row; argmax: every
    logits row's argmax, where the sampling already took it.
    Returns each verified request's path (input batch index -> tree nodes of its output tokens, root first)."""
    md = runner.input_batch.sampling_metadata
    sampled = sampler_output.sampled_token_ids
    # Written through a numpy view: a tenth of the time of two torch operations a request on a CPU (on a GPU, a host
    # copy written back once).
    host = sampled if sampled.device.type == "cpu" else sampled.cpu()
    out_rows = host.numpy()
    row0 = first_rows(spec_md)
    table = runner.input_batch.block_table[0]
    blocks, block_size = table.get_cpu_tensor().numpy(), table.block_size
    moves_src: list[int] = []
    moves_dst: list[int] = []
    paths: dict[int, list[int]] = {}
    # The target's argmax at the trees' rows, as vLLM's greedy sampler takes it, in one call for the whole step (a
    # call per tree made verification 3.0 instead of 2.3 ms a step at 16 bfloat16 requests); only those rows, since at
    # a large batch most requests carry no tree and vLLM's sampler has drawn their one row.
    argmax_of = _tree_argmax(logits, [(row0[s.req_index], s.tree.num_nodes) for s in step.scheduled], argmax)
    verified: list[Verified] = []
    for s, tree_argmax in zip(step.scheduled, argmax_of, strict=True):
        n = s.tree.num_nodes
        first_row = row0[s.req_index]
        greedy = is_greedy(md, s.req_index)
        if greedy:
            accepted, tokens = greedy_verify(s.tree, tree_argmax)
        else:
            first = int(out_rows[s.req_index, 0]) if first_rows_sampled else None
            rows = logits[first_row : first_row + n]
            accepted, tokens = draw_verify(s.tree, partial(draw_at, runner.sampler, md, s.req_index, rows, first))
        out_rows[s.req_index] = -1
        out_rows[s.req_index, : len(tokens)] = tokens
        paths[s.req_index] = [0, *accepted]
        for d, u in enumerate(accepted, start=1):
            if u != d:  # node u sits at the slot of position P+u; vLLM expects depth d at P+d
                moves_src.append(_slot(blocks, block_size, s.req_index, s.prefix_len + u))
                moves_dst.append(_slot(blocks, block_size, s.req_index, s.prefix_len + d))
        verified.append(Verified(s, tree_argmax, accepted, tokens, greedy))
    want = [v.scheduled.req_index for v in verified if _recycles(requests, v.scheduled)]
    top = recycling.path_top(logits, row0, paths, want)
    for v in verified:
        _update(requests, stats, v, top.get(v.scheduled.req_index))
    if host is not sampled:
        sampled.copy_(host, non_blocking=True)
    if moves_src:
        step.backend.relocate(attention_layers(runner), moves_src, moves_dst)
    return paths


def _tree_argmax(logits: torch.Tensor, spans: list[tuple[int, int]], every: list[int] | None = None) -> list[list[int]]:
    """The argmax of each (first row, rows) span of the logits, from one `row_argmax` over the spans' rows alone (at a
    large batch most requests carry no tree: their rows are not read). `every`: every row's, already taken."""
    if every is None:
        flat = row_argmax(logits, [r for first, n in spans for r in range(first, first + n)])
        out, at = [], 0
        for _, n in spans:
            out.append(flat[at : at + n])
            at += n
        return out
    return [every[first : first + n] for first, n in spans]


def _slot(blocks: np.ndarray, block_size: int, req_index: int, position: int) -> int:
    """The KV cache slot of a request's token position, as vLLM's slot mapping computes it from the block table."""
    return int(blocks[req_index, position // block_size]) * block_size + position % block_size


def _recycles(requests: Requests, s: ScheduledTree) -> bool:
    state = requests.states.get(s.req_id)
    return state is not None and state.recycle is not None


def _update(requests: Requests, stats: LookaheadStats, v: Verified, top: list[list[int]] | None) -> None:
    s = v.scheduled
    state = requests.states.get(s.req_id)
    if state is not None:
        state.update(s.tree, v.argmax, v.tokens, top)
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


def _count_sources(stats: LookaheadStats, tree: StepTree, accepted: list[int]) -> None:
    stats.carried_score += sum(tree.scores[1:])
    sources = tree.sources
    for u in range(1, tree.num_nodes):
        stats.drafted[SOURCE_NAMES[sources[u] - 1]] += 1
    for u in accepted:
        stats.accepted_by[SOURCE_NAMES[sources[u] - 1]] += 1


def attention_layers(runner: GPUModelRunner) -> list:
    """The runner's attention layers that own a KV cache (found once: the same list every step, which the backend
    may key what it checked of the caches on)."""
    found = getattr(runner, "_lookahead_attn_layers", None)
    if found is None:
        ctx = runner.compilation_config.static_forward_context
        found = [m for m in ctx.values() if hasattr(m, "kv_cache") and hasattr(m, "impl")]
        runner._lookahead_attn_layers = found
    return found
