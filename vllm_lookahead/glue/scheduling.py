"""What vLLM scheduled of the proposed trees: each request's tree cut to its scheduled drafts, its tree tokens'
positions, and the rows the attention backend computes as a tree.

vLLM derives the KV slots from linear positions (`num_computed_tokens + arange`) before this runs, so a tree node
u keeps the slot of position P+u; here its position, which RoPE reads, becomes P + its depth. Those position writes
are one of the engine's three writes into vLLM's data: every tree's at once, from one host buffer uploaded in one
copy (`staging`; vLLM's positions live on the device on a GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm_lookahead.backends import TreeRows
from vllm_lookahead.backends.staging import to_device
from vllm_lookahead.core.tree import StepTree
from vllm_lookahead.glue.step import LookaheadStep, ScheduledTree

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner


def schedule_trees(
    step: LookaheadStep,
    runner: GPUModelRunner,
    scheduler_output: SchedulerOutput,
    plain_greedy: Callable[[GPUModelRunner, str], bool],
) -> None:
    """Match vLLM's scheduled drafts to the step's proposed trees (`step.scheduled`), write the tree tokens'
    positions and record the rows of trees that branch (`step.attention_rows`).
    plain_greedy: whether a request's drafts that this engine did not make are verified here as a chain."""
    spec = scheduler_output.scheduled_spec_decode_tokens
    if not spec:
        return
    batch = runner.input_batch
    qsl = runner.query_start_loc.np
    computed = batch.num_computed_tokens_cpu
    block_table = batch.block_table[0].get_cpu_tensor()
    rows: list[np.ndarray] = []  # the branching trees' query rows and their positions
    for req_id, drafts in spec.items():
        if not drafts:
            continue
        idx = batch.req_id_to_index[req_id]
        prefix_len = int(computed[idx])
        x0 = int(batch.token_ids_cpu[idx, prefix_len])
        tree = step.proposed.get(req_id)
        k = len(drafts)
        ours = tree is not None and tree.tokens[0] == x0 and tree.tokens[1 : k + 1] == list(drafts)
        if ours:
            tree = tree.truncate(k + 1)  # the scheduler may schedule a prefix of the drafts
        elif plain_greedy(runner, req_id):
            # Drafts this engine did not make (vLLM pads every request with zeros near max_model_len): verified as a
            # chain, which the stock attention computes as it is. vLLM's own verification of that padding was seen
            # to return wrong tokens, so greedy requests (opted-out ones too) are checked here.
            tree = StepTree.chain([x0, *drafts])
        else:
            continue  # sampling etc.: vLLM's verification stands
        q_start = int(qsl[idx])
        step.scheduled.append(ScheduledTree(req_id, idx, q_start, prefix_len, tree, ours))
        if not tree.is_chain:
            n = tree.num_nodes
            rows.append(np.stack([np.arange(q_start, q_start + n), np.add(tree.depths, prefix_len)]))
            step.attention_rows.append(
                TreeRows(idx, q_start, n, prefix_len + n, block_table[idx], tree.ancestor_mask())
            )
    if rows:
        write_positions(runner.positions, np.concatenate(rows, axis=1))


def write_positions(positions: torch.Tensor, rows: np.ndarray) -> None:
    """positions[rows[0]] = rows[1]: one upload of both and one scatter on the positions' device."""
    both = to_device(rows.reshape(-1), torch.int64, positions.device).view(2, -1)
    positions.index_copy_(0, both[0], both[1].to(positions.dtype))
