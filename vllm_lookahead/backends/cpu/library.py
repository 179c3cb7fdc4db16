"""The compiled CPU library loaded (ctypes) and wrapped for torch tensors: one attention layer's tree rows
(`layer`), accepted nodes' KV moved in every layer's cache (`move_slots`), logits rows' largest entries (`top_k`).

`load` builds it where need be (`kernel.build`) and loads it once per process; without a compiler, or where the
build fails, it returns None (said once in the log) and the backends take their plain-torch paths.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np
import torch

from vllm_lookahead.backends.cpu import kernel

logger = logging.getLogger("vllm_lookahead")

ROW_DTYPES = (torch.float32, torch.bfloat16)  # what `top_k` reads
HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)  # the source's DISPATCH list
# The int64 argument block of `tree_attn_layer`, in the source's order (scale travels as its float32 bits; layout
# is the cache's `layouts.Layout.kernel_code`; the strides come last, set by the step's first layer).
ARGS = (
    "items", "num_items", "block_table", "block_table_stride", "masks", "mask_words", "scale_bits", "block_size",
    "head_size", "queries_per_kv", "bf16", "max_rows", "parallel", "layout",
    "q_stride0", "q_stride1", "kv_stride0", "kv_stride1", "out_stride0", "out_stride1",
)  # fmt: skip


class CompiledLibrary:
    """The loaded library: `layer(args, q, kv, out)` runs one attention layer's tree rows; `move_slots` moves
    accepted nodes' K/V in every layer's cache at once; `top_k` takes logits rows' largest entries."""

    def __init__(self, path: Path) -> None:
        self._lib = ctypes.CDLL(str(path))
        fn = self._lib.tree_attn_layer
        fn.argtypes = [ctypes.c_void_p] * 4
        fn.restype = ctypes.c_int
        self._fn = fn
        move = self._lib.kv_move_slots
        move.argtypes = [ctypes.c_void_p] * 4
        move.restype = ctypes.c_int
        self._move = move
        self.vector_width: int = self._lib.tree_attn_vector_width()
        top = self._lib.rows_top_k
        top.argtypes = [ctypes.c_void_p] * 4
        top.restype = ctypes.c_int
        self._top = top
        self.max_k: int = self._lib.rows_top_k_max()

    def layer(self, args_ptr: int, q_ptr: int, kv_ptr: int, out_ptr: int) -> None:
        rc = self._fn(args_ptr, q_ptr, kv_ptr, out_ptr)
        if rc:
            raise RuntimeError(f"tree-attention kernel refused its arguments (code {rc})")

    def move_slots(self, caches: Sequence[torch.Tensor], src: Sequence[int], dst: Sequence[int], layout: int) -> None:
        """Copy every cache's K/V at global slots `src` to slots `dst` (pairwise; all sources read first): caches
        of one shape, dtype and strides ([blocks, kv heads, block size, 2 * head size]), all in the layout whose
        `layouts.Layout.kernel_code` is `layout`."""
        c = caches[0]
        num_blocks, num_kv_heads, block_size, two_d = c.shape
        shape = (len(caches), len(src), num_kv_heads, block_size, two_d // 2, c.element_size())
        sizes = np.array([*shape, c.stride(0), c.stride(1), layout], np.int64)
        ptrs = np.array([x.data_ptr() for x in caches], np.int64)
        src_a = np.asarray(src, np.int64)
        dst_a = np.asarray(dst, np.int64)
        if len(src_a) != len(dst_a) or (len(src_a) and max(src_a.max(), dst_a.max()) >= num_blocks * block_size):
            raise ValueError("vllm-lookahead: KV moves outside the cache or unpaired")
        rc = self._move(sizes.ctypes.data, ptrs.ctypes.data, src_a.ctypes.data, dst_a.ctypes.data)
        if rc:
            raise RuntimeError(f"KV move kernel refused its arguments (code {rc})")

    def top_k(self, matrix: torch.Tensor, k: int, rows: Sequence[int] | None = None) -> np.ndarray:
        """The indices of the k largest entries of each row of `matrix` (of its `rows`, in that order, where given),
        largest first, as a [rows, k] int64 array: NaN above every number, of equal values the lower index first
        (k = 1: vLLM's greedy argmax). `matrix`: a CPU float32 or bfloat16 matrix whose rows are contiguous
        (`takes_rows`); k at most its columns and `max_k`."""
        if not takes_rows(matrix):
            raise ValueError(
                f"vllm-lookahead: top_k takes CPU float32/bfloat16 rows, not {matrix.dtype} {matrix.shape}"
            )
        count, cols = matrix.shape
        index = None if rows is None else np.asarray(rows, np.int64)
        if index is not None:
            if len(index) and (index.min() < 0 or index.max() >= count):
                raise ValueError("vllm-lookahead: top_k rows outside the matrix")
            count = len(index)
        out = np.empty((count, k), np.int64)
        if count:
            sizes = np.array([count, cols, matrix.stride(0), matrix.dtype == torch.bfloat16, k], np.int64)
            at = None if index is None else index.ctypes.data
            if self._top(sizes.ctypes.data, matrix.data_ptr(), at, out.ctypes.data):
                raise ValueError(f"vllm-lookahead: top_k's k={k} is outside 1..min({cols}, {self.max_k})")
        return out


def takes_rows(matrix: torch.Tensor) -> bool:
    """Whether `CompiledLibrary.top_k` reads this matrix: CPU, float32 or bfloat16, two dimensions, contiguous rows."""
    return matrix.dim() == 2 and matrix.device.type == "cpu" and matrix.dtype in ROW_DTYPES and matrix.stride(1) == 1


@cache
def load() -> CompiledLibrary | None:
    """The library, built if needed; None (logged once) where it cannot be built or loaded."""
    try:
        return CompiledLibrary(kernel.build())
    except (RuntimeError, OSError) as e:
        logger.warning("vllm-lookahead: the compiled tree-attention kernel is unavailable (%s); tree rows use the "
                       "slower plain-torch path.", e)  # fmt: skip
        return None
