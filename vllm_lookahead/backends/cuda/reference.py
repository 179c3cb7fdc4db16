"""Tree attention over vLLM's CUDA paged KV layout in plain torch: what the Triton kernel (`tree_kernel`) computes.

The cache halves are [num_blocks, block_size, num_kv_heads, head_size] (FlashAttention's and the Triton backend's
layout). Each tree's K/V are gathered through its own block-table row (`TreeRows.block_ids`, not the batch block
table the kernel reads, so the two paths check each other) and the scores are computed in float32 with an explicit
softmax. Imports neither vLLM nor Triton.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_lookahead.backends.base import TreeRows


def gather_paged(cache: torch.Tensor, block_ids: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one request from a cache half, as [num_kv_heads, length, head_size]."""
    block_size = cache.shape[1]
    pos = torch.arange(length, device=cache.device)
    blocks = block_ids.to(cache.device).long()[pos // block_size]
    return cache[blocks, pos % block_size].transpose(0, 1)


def tree_attention_rows(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """query [n, num_heads, D]; key/value [num_kv_heads, L, D] whose last n entries are the tree's nodes.

    Returns float32 [n, num_heads, D]: node u attends the L - n prefix entries and the nodes v with mask[u, v].
    """
    n, num_heads, _ = query.shape
    num_kv_heads, length, _ = key.shape
    group = num_heads // num_kv_heads
    k = key.float().repeat_interleave(group, dim=0)  # query head h reads kv head h // group
    v = value.float().repeat_interleave(group, dim=0)
    scores = torch.einsum("nhd,hld->hnl", query.float(), k) * scale
    allowed = torch.ones(n, length, dtype=torch.bool, device=query.device)
    allowed[:, length - n :] = mask.to(query.device)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hnl,hld->nhd", probs, v)


def reference_tree_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    rows: Sequence[TreeRows],
    scale: float,
    output: torch.Tensor,
) -> torch.Tensor:
    """Overwrite the tree rows of `output` ([num_tokens, num_heads, D]); every other row is left as it is."""
    for t in rows:
        k = gather_paged(key_cache, t.block_ids, t.seq_len)
        v = gather_paged(value_cache, t.block_ids, t.seq_len)
        sl = slice(t.q_start, t.q_start + t.num_nodes)
        output[sl] = tree_attention_rows(query[sl], k, v, t.mask, scale).to(output.dtype)
    return output
