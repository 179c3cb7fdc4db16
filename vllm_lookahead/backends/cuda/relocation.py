"""Moving accepted tree nodes' K/V between slots in every layer's cache at once (vLLM's FLASH_ATTN / TRITON_ATTN
layout: a token's K and V for every KV head lie together, `cell` elements at slot `block * block_size + offset`).

Two launches a step whatever the number of layers: every source cell of every layer is copied to a scratch buffer,
then from there to its destination, so that overlapping moves (node 2 to slot 1 while node 3 goes to slot 2) read
what was there before any write. The layers' caches are reached through a table of their base addresses, so they
need not share one allocation, only one shape, dtype and strides (else `move_cells` says no and the caller copies
layer by layer). Bits are copied as integers of the element's width: no conversion.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

_INT = {1: tl.int8, 2: tl.int16, 4: tl.int32, 8: tl.int64}
_TORCH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
BLOCK = 256


@triton.jit
def _copy_cells(
    bases_ptr, scratch_ptr, blocks_ptr, offsets_ptr, num_moves, cell, stride_block, stride_token,
    TO_SCRATCH: tl.constexpr, INT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    layer = tl.program_id(0)
    move = tl.program_id(1)
    idx = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    keep = idx < cell
    base = tl.load(bases_ptr + layer).to(tl.pointer_type(INT))
    block = tl.load(blocks_ptr + move).to(tl.int64)
    offset = tl.load(offsets_ptr + move).to(tl.int64)
    at = base + block * stride_block + offset * stride_token + idx
    kept = scratch_ptr + (layer.to(tl.int64) * num_moves + move) * cell + idx
    if TO_SCRATCH:
        tl.store(kept, tl.load(at, mask=keep), mask=keep)
    else:
        tl.store(at, tl.load(kept, mask=keep), mask=keep)


def cells_alike(caches: Sequence[torch.Tensor]) -> bool:
    """Whether the caches ([num_blocks, num_kv_heads, block_size, 2 * head_size] views, vLLM's layout) share one shape,
    dtype and strides, with each token's cell contiguous: what `move_cells` moves in two launches."""
    if not caches:
        return False
    c = caches[0]
    cell = c.shape[1] * c.shape[3]
    contiguous_cell = c.stride(3) == 1 and c.stride(1) == c.shape[3] and c.stride(2) == cell
    return (
        contiguous_cell
        and c.element_size() in _INT
        and all(
            x.shape == c.shape and x.stride() == c.stride() and x.dtype == c.dtype and x.device == c.device
            for x in caches
        )
    )


def move_cells(caches: Sequence[torch.Tensor], src: Sequence[int], dst: Sequence[int]) -> None:
    """Every cache's cell at slot src[i] copied to slot dst[i] (all sources read first). Caches as `cells_alike`."""
    c = caches[0]
    block_size, cell = c.shape[2], c.shape[1] * c.shape[3]
    slots = torch.tensor([list(src), list(dst)], dtype=torch.int64)
    blocks, offsets = (slots // block_size).to(c.device), (slots % block_size).to(c.device)
    bases = torch.tensor([x.data_ptr() for x in caches], dtype=torch.int64).to(c.device)
    scratch = torch.empty(len(caches) * len(src) * cell, dtype=_TORCH_INT[c.element_size()], device=c.device)
    grid = (len(caches), len(src), triton.cdiv(cell, BLOCK))
    width = _INT[c.element_size()]
    for side, to_scratch in ((0, True), (1, False)):
        _copy_cells[grid](
            bases, scratch, blocks[side], offsets[side], len(src), cell, c.stride(0), c.stride(2),
            TO_SCRATCH=to_scratch, INT=width, BLOCK=BLOCK,
        )  # fmt: skip
