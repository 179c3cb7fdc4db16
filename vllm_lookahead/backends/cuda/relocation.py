"""Moving accepted tree nodes' K/V between slots in every layer's cache at once (vLLM's FLASH_ATTN / TRITON_ATTN
layout: a token's K and V for every KV head lie together, `cell` elements at slot `block * block_size + offset`).

Two launches a step whatever the number of layers: every source cell of every layer is copied to a scratch buffer,
then from there to its destination, so that overlapping moves (node 2 to slot 1 while node 3 goes to slot 2) read
what was there before any write. The layers' caches are reached through a table of their base addresses (`Cells`,
uploaded once), so they need not share one allocation, only one shape, dtype and strides (else `Cells.of` says no
and the caller copies layer by layer). A step's moves go to the device as one buffer in one copy (`staging`), and
the kernel does not specialise on their number, so its two variants (to and from scratch) are all there is to
compile (`warm_up`). Bits are copied as integers of the element's width: no conversion.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vllm_lookahead.backends.staging import host_empty, upload

_INT = {1: tl.int8, 2: tl.int16, 4: tl.int32, 8: tl.int64}
_TORCH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
BLOCK = 256


@triton.jit(do_not_specialize=["num_moves"])
def _copy_cells(
    bases_ptr, scratch_ptr, moves_ptr, num_moves, cell, stride_block, stride_token,
    SIDE: tl.constexpr, INT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """SIDE 0: every layer's cell at each move's source slot into scratch; SIDE 1: scratch into the destinations.
    moves: int64 [2 sides, 2 (block, offset), num_moves]."""
    layer = tl.program_id(0)
    move = tl.program_id(1)
    idx = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    keep = idx < cell
    base = tl.load(bases_ptr + layer).to(tl.pointer_type(INT))
    block = tl.load(moves_ptr + (2 * SIDE) * num_moves + move)
    offset = tl.load(moves_ptr + (2 * SIDE + 1) * num_moves + move)
    at = base + block * stride_block + offset * stride_token + idx
    kept = scratch_ptr + (layer.to(tl.int64) * num_moves + move) * cell + idx
    if SIDE == 0:
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


@dataclass(frozen=True)
class Cells:
    """The layers' caches as `move_cells` reaches them: a device table of their base addresses and their shared
    geometry. Built once for a model's layers (their caches stay where vLLM allocated them)."""

    bases: torch.Tensor  # int64 [num_layers] on the caches' device
    block_size: int
    cell: int  # elements of one token's K and V for every KV head
    stride_block: int
    stride_token: int
    element_size: int

    @staticmethod
    def of(caches: Sequence[torch.Tensor]) -> Cells | None:
        """The table for caches that are `cells_alike`, else None."""
        if not cells_alike(caches):
            return None
        c = caches[0]
        host = host_empty(len(caches), torch.int64, c.device)
        host.copy_(torch.tensor([x.data_ptr() for x in caches], dtype=torch.int64))
        return Cells(upload(host, c.device), c.shape[2], c.shape[1] * c.shape[3], c.stride(0), c.stride(2),
                     c.element_size())  # fmt: skip

    @property
    def num_layers(self) -> int:
        return self.bases.shape[0]


def move_indices(src: Sequence[int], dst: Sequence[int], block_size: int, device: torch.device) -> torch.Tensor:
    """The moves as the kernel reads them, int64 [2 (src, dst), 2 (block, offset), n] on `device`: one copy."""
    host = host_empty((2, 2, len(src)), torch.int64, device)
    slots = torch.tensor([list(src), list(dst)], dtype=torch.int64)
    host[:, 0] = slots // block_size
    host[:, 1] = slots % block_size
    return upload(host, device)


def move_cells(cells: Cells | Sequence[torch.Tensor], src: Sequence[int], dst: Sequence[int]) -> None:
    """Every cache's cell at slot src[i] copied to slot dst[i] (all sources read first). `cells`: a `Cells` table, or
    caches that are `cells_alike` (their table is then built for this call)."""
    if not isinstance(cells, Cells):
        table = Cells.of(cells)
        if table is None:
            raise ValueError("move_cells: the caches differ in shape, dtype or strides")
        cells = table
    if not src:
        return
    device = cells.bases.device
    moves = move_indices(src, dst, cells.block_size, device)
    scratch = torch.empty(cells.num_layers * len(src) * cells.cell, dtype=_TORCH_INT[cells.element_size],
                          device=device)  # fmt: skip
    grid = (cells.num_layers, len(src), triton.cdiv(cells.cell, BLOCK))
    for side in (0, 1):
        _copy_cells[grid](
            cells.bases, scratch, moves, len(src), cells.cell, cells.stride_block, cells.stride_token,
            SIDE=side, INT=_INT[cells.element_size], BLOCK=BLOCK,
        )  # fmt: skip


def warm_up(cells: Cells) -> list[int]:
    """Compile both of the kernel's variants (`SIDE` 0 and 1) with one move of slot 0 onto itself, which leaves every
    cache as it was. Returns the sides launched."""
    move_cells(cells, [0], [0])
    return [0, 1]
