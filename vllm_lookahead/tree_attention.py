"""Tree attention over a paged KV cache in plain torch (the CPU path; a GPU kernel can offer the same API).

A lookahead request's step tree is scheduled as its draft tokens, so the stock kernel sees it as a causal
chain. For those query rows the result is recomputed here: every tree node attends to the whole cached prefix
plus its own ancestors (and itself), read back from the paged cache that the stock path has just written.

The CPU_ATTN "vec" cache layout, per block and KV head: keys transposed as [head_size, block_size], values as
[block_size, head_size]. `check_cache_layout` proves that against vLLM's own writer before any use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class TreeSpan:
    """One lookahead request in this step's batch."""

    q_start: int  # first query row (the root x0) in the flattened batch
    num_nodes: int  # tree nodes scheduled (root included); the request's query rows are q_start .. +num_nodes
    seq_len: int  # cached prefix + num_nodes: every KV entry the request has after this step's write
    block_ids: torch.Tensor  # [>= ceil(seq_len / block_size)] the request's block table row
    mask: torch.Tensor  # [num_nodes, num_nodes] bool, mask[u, v]: node u attends node v


def gather_kv(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_ids: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first seq_len tokens' K and V of one request as [num_kv_heads, seq_len, head_size] each.

    key_cache / value_cache are the two halves of a CPU_ATTN layer cache viewed as
    [num_blocks, num_kv_heads, block_size, head_size] (the backend's own `chunk(2, dim=2)` views).
    """
    _, num_kv_heads, block_size, head_size = value_cache.shape
    nblk = (seq_len + block_size - 1) // block_size
    ids = block_ids[:nblk].long()
    # Keys: each block holds [head_size, block_size] in the memory of a [block_size, head_size] view.
    k = key_cache[ids].reshape(nblk, num_kv_heads, head_size, block_size)
    k = k.permute(1, 0, 3, 2).reshape(num_kv_heads, nblk * block_size, head_size)[:, :seq_len]
    v = value_cache[ids].permute(1, 0, 2, 3).reshape(num_kv_heads, nblk * block_size, head_size)[:, :seq_len]
    return k, v


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
    spans: list[TreeSpan],
    scale: float,
) -> None:
    """Overwrite the tree requests' rows of `output` ([num_tokens, num_heads * D] or [num_tokens, H, D])."""
    num_heads, head_size = query.shape[1], query.shape[2]
    out3 = output.view(output.shape[0], num_heads, head_size)
    for s in spans:
        k, v = gather_kv(key_cache, value_cache, s.block_ids, s.seq_len)
        rows = slice(s.q_start, s.q_start + s.num_nodes)
        out3[rows] = tree_attention(query[rows], k, v, s.mask, scale)


def read_slots(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_ids: torch.Tensor, slots: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V at the given token offsets of one request, as [len(slots), num_kv_heads, D] each."""
    block_size = value_cache.shape[2]
    idx = torch.tensor(slots, dtype=torch.long)
    blocks = block_ids.long()[idx // block_size]
    off = idx % block_size
    k = key_cache[blocks]  # [m, H, bs, D] memory holding [H, D, bs]
    m, h, bs, d = k.shape
    k = k.reshape(m, h, d, bs)[torch.arange(m), :, :, off]  # [m, H, D]
    v = value_cache[blocks, :, off]  # [m, H, D]
    return k.contiguous(), v.contiguous()


def check_cache_layout(
    write_fn, dtype: torch.dtype, num_kv_heads: int, head_size: int, block_size: int
) -> None:
    """Write random K/V with vLLM's own cache writer and read them back with gather_kv/read_slots.

    write_fn(key, value, key_cache, value_cache, slot_mapping) is the backend's writer. Raises RuntimeError
    if this module does not understand the layout (another ISA or vLLM release): fail loudly, never misread.
    """
    nb = 3
    kv = torch.zeros(nb, num_kv_heads, block_size, 2 * head_size, dtype=dtype)
    kc, vc = kv.view(nb, num_kv_heads, 2 * block_size, head_size).chunk(2, dim=2)
    n = 2 * block_size + 3
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
    value = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
    block_ids = torch.tensor([2, 0, 1], dtype=torch.int32)
    slots = block_ids.long()[torch.arange(n) // block_size] * block_size + torch.arange(n) % block_size
    write_fn(key, value, kc, vc, slots)
    k, v = gather_kv(kc, vc, block_ids, n)
    rk, rv = read_slots(kc, vc, block_ids, [0, 5, n - 1])
    ok = (
        torch.equal(k, key.transpose(0, 1))
        and torch.equal(v, value.transpose(0, 1))
        and torch.equal(rk, key[[0, 5, n - 1]])
        and torch.equal(rv, value[[0, 5, n - 1]])
    )
    if not ok:
        raise RuntimeError(
            "vllm-lookahead: this vLLM build's CPU attention KV-cache layout is not the one the lookahead "
            f"attention path reads (dtype={dtype}, block_size={block_size}); lookahead cannot run here."
        )


def ancestor_mask_tensor(tree) -> torch.Tensor:
    """[n, n] bool: mask[u, v] iff v is u or an ancestor of u (from StepTree.parents, parents first)."""
    n = tree.num_nodes
    mask = torch.zeros(n, n, dtype=torch.bool)
    parents = tree.parents
    mask[0, 0] = True
    for u in range(1, n):
        mask[u] = mask[parents[u]]
        mask[u, u] = True
    return mask
