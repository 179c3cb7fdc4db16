"""The compiled CPU library: the tree-attention kernel and the KV moves (csrc/tree_attention.cpp) and the logits rows'
top entries (csrc/row_select.cpp), built with the system C++ compiler into one library, loaded by ctypes.

The sources have no torch headers, so it builds in a few seconds with `g++ -O3 -fopenmp`; the shared library is
cached on disk keyed by source, compiler and flags, so a CPU-specific build is never reused on another CPU. `make`
set-up builds it (`python -m vllm_lookahead.backends.cpu.kernel`); otherwise the first lookahead step does. Its OpenMP
calls bind to the runtime the process already has (vLLM preloads torch's libgomp or Intel's libiomp5, which
exports the same entry points), so it shares torch's threads. Without a compiler the kernel is unavailable and the
plain-torch path runs instead, with one log line.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np
import torch

from vllm_lookahead.cache import cache_root

logger = logging.getLogger("vllm_lookahead")

CSRC = Path(__file__).with_name("csrc")
SOURCES = (CSRC / "tree_attention.cpp", CSRC / "row_select.cpp")
HEADERS = (CSRC / "vectors.h",)  # included by the sources: part of the build's cache key
BASE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno", "-ffp-contract=fast")
ROW_DTYPES = (torch.float32, torch.bfloat16)  # what `top_k` reads
HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)  # the source's DISPATCH list
# The int64 argument block of `tree_attn_layer`, in the source's order (scale travels as its float32 bits; layout
# is the cache's `layouts.Layout.kernel_code`; the strides come last, set by the step's first layer).
ARGS = (
    "items", "num_items", "block_table", "block_table_stride", "masks", "mask_words", "scale_bits", "block_size",
    "head_size", "queries_per_kv", "bf16", "max_rows", "parallel", "layout",
    "q_stride0", "q_stride1", "kv_stride0", "kv_stride1", "out_stride0", "out_stride1",
)  # fmt: skip


def isa_flags() -> tuple[str, ...]:
    """The widest vector ISA this CPU has that the source is written for (no -march=native: the cache is keyed)."""
    if torch.cpu._is_avx512_supported():
        return ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma")
    if torch.cpu._is_avx2_supported():
        return ("-mavx2", "-mfma", "-mf16c")
    return ()


def cache_dir() -> Path:
    """Built kernels live next to the prepared models: $VLLM_LOOKAHEAD_CACHE/kernels."""
    return cache_root() / "kernels"


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


def build() -> Path:
    """Compile the kernel unless a build of this source with these flags is cached; the library's path."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX or install g++)")
    flags = (*BASE_FLAGS, *isa_flags())
    source = b"".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    key = hashlib.sha256(source + " ".join((cxx, *flags)).encode()).hexdigest()[:16]
    out_dir = cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / f"tree_attention_{key}.so"
    if not lib.exists():
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
        os.close(fd)
        try:
            subprocess.run([cxx, *flags, *map(str, SOURCES), "-o", tmp], check=True, capture_output=True, text=True)
            os.replace(tmp, lib)  # atomic: workers building at once race harmlessly
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"building the compiled CPU library failed:\n{e.stderr}") from e
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return lib


class TreeKernel:
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
    """Whether `TreeKernel.top_k` reads this matrix: CPU, float32 or bfloat16, two dimensions, contiguous rows."""
    return matrix.dim() == 2 and matrix.device.type == "cpu" and matrix.dtype in ROW_DTYPES and matrix.stride(1) == 1


@cache
def load() -> TreeKernel | None:
    """The kernel, built if needed; None (logged once) where it cannot be built or loaded."""
    if os.environ.get("VLLM_LOOKAHEAD_TREE_KERNEL", "1") == "0":
        return None
    try:
        return TreeKernel(build())
    except (RuntimeError, OSError) as e:
        logger.warning("vllm-lookahead: the compiled tree-attention kernel is unavailable (%s); tree rows use the "
                       "slower plain-torch path.", e)  # fmt: skip
        return None


def main() -> int:
    """Build (or find cached) and print the library's path. Without a compiler: a notice, and success (the plugin
    then uses the plain-torch path); a compiler that fails: an error."""
    if compiler() is None:
        print("no C++ compiler: lookahead's tree rows will use the plain-torch path (install g++ for the kernel)")
        return 0
    try:
        path = build()
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
