"""Tree attention over the paged CPU KV cache, in plain torch (the interface a faster kernel implements too).

A lookahead request's step tree is scheduled as its draft tokens, so vLLM's stock kernel sees it as a causal
chain. For those query rows the result is recomputed here: every tree node attends to the whole cached prefix
plus its own ancestors (and itself), read back from the paged cache that vLLM has just written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vllm_lookahead.backends.base import TreeRows
from vllm_lookahead.backends.cpu import layouts as cpu_kv_cache
from vllm_lookahead.backends.cpu.layouts import gather_kv

if TYPE_CHECKING:
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl


def tree_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """query [n, num_heads, D]; key/value [num_kv_heads, L, D] whose last n entries are the tree nodes.

    Returns [n, num_heads, D]: node u attends the L - n prefix entries and the nodes v with mask[u, v].
    """
    n = query.shape[0]
    seq_len = key.shape[1]
    full = torch.ones(n, seq_len, dtype=torch.bool, device=query.device)
    full[:, seq_len - n :] = mask
    q = query.transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
    out = F.scaled_dot_product_attention(
        q.float(),
        key.unsqueeze(0).float(),
        value.unsqueeze(0).float(),
        attn_mask=full,
        scale=scale,
        enable_gqa=key.shape[0] != query.shape[1],
    )
    return out[0].transpose(0, 1).to(query.dtype)


def apply_tree_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    output: torch.Tensor,
    trees: Sequence[TreeRows],
    scale: float,
    isa: str = "vec",
) -> None:
    """Overwrite the tree requests' rows of `output` ([num_tokens, num_heads * D] or [num_tokens, H, D]).

    key_cache / value_cache: a layer's cache halves (`cpu_kv_cache.split`) in vLLM's `isa` layout.
    """
    num_heads, head_size = query.shape[1], query.shape[2]
    out3 = output.view(output.shape[0], num_heads, head_size)
    for t in trees:
        k, v = gather_kv(key_cache, value_cache, t.block_ids, t.seq_len, isa)
        rows = slice(t.q_start, t.q_start + t.num_nodes)
        out3[rows] = tree_attention(query[rows], k, v, t.mask, scale)


def attend_layer(
    trees: Sequence[TreeRows],
    layer: Attention,
    impl: CPUAttentionBackendImpl,
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    output: torch.Tensor,
) -> None:
    """One attention layer's tree rows, after vLLM wrote this step's KV and ran its own kernel."""
    cpu_kv_cache.ensure_layout(layer, impl, kv_cache)
    key_cache, value_cache = cpu_kv_cache.split(kv_cache)
    apply_tree_attention(query, key_cache, value_cache, output, trees, impl.scale, layer.isa)
