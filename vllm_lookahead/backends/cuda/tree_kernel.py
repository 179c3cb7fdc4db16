"""Tree attention for lookahead's tree rows over vLLM's CUDA paged KV cache: one Triton launch per layer (two when
the step's prefix is split, see below).

vLLM's own attention sees a request's step tree as a causal chain; this kernel recomputes the tree rows only: node u
of a request (query row q_start + u, K/V written at token index prefix_len + u) attends the request's whole cached
prefix [0, prefix_len) plus the nodes v with mask[u, v] (its ancestors and itself). Plain rows are never written.

Work split: one program per (tile, kv head). A tile is BLOCK_M consecutive rows of one tree's (node, query head of
the kv group) rows, node-major, so a program loads each K/V tile once for all the query heads sharing it (GQA) and
for BLOCK_M / queries_per_kv nodes at once: every row of a tree shares the prefix, so the prefix loop is a plain
dense loop (tl.dot, no mask but the last partial tile's). Then the tree's own keys, 32 nodes a tile, masked by one
packed 32-bit ancestor word per row. The tree loop stops at the tile's last attended node (parents precede children,
so a tile of early nodes skips the later nodes' keys).

When a step has too few (tile, kv head) programs to fill the GPU (a few trees over long prefixes), the prefix is
split into num_splits segments of whole key tiles, one program each (the last also takes the tree's keys); they
write unnormalised partials (acc, running max, sum) to a float32 workspace and `_combine_splits_kernel` merges them
into the output rows (flash-decoding). `choose_tiling` picks BLOCK_M and num_splits per step from a cost model.

Per step, `TreeBatch.build` packs the descriptors on the host (numpy, vectorised over trees) before the forward pass
and uploads them in one copy that does not wait for the stream; every layer then launches with Python ints and
device pointers only (no host sync). `warm_up` compiles every variant a step can launch (the tile heights
`choose_tiling` picks from, split or not, and the merge), so that none compiles while requests wait.

Imports no vLLM: the same module runs on a GPU machine with torch and Triton alone, and on CPU under Triton's
interpreter (TRITON_INTERPRET=1 set before this module is imported; bfloat16 dots are computed in float32 there, as
the interpreter's dot cannot multiply bfloat16).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
import triton
import triton.language as tl

from vllm_lookahead.backends.base import TreeRows
from vllm_lookahead.backends.staging import host_empty, upload

WORD_BITS = 32  # ancestor bits per int32 word = tree keys per tree tile
TILE_FIELDS = 8  # int32 per tile descriptor, see TreeBatch
BLOCK_M_CHOICES = (128, 64, 32, 16)
# The tile heights choose_tiling picks from: 128-row tiles were slower than 64-row ones in 4 of 5 shapes swept on an
# H200 (bf16, 32/8 heads of 128; e.g. 64 trees of 128 nodes over 2048 cached tokens: 0.92 against 1.08 ms).
AUTO_BLOCK_M = (64, 32, 16)
_LOG2E = 1.4426950408889634


@triton.jit
def _block_ids(bt_row_ptr, stride_btc, pos, pos_ok, BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr):
    """The cache block of each token index (read once a tile, shared by the K and the V load)."""
    if MASKED:
        blk = tl.load(bt_row_ptr + (pos // BLOCK_SIZE) * stride_btc, mask=pos_ok, other=0)
    else:
        blk = tl.load(bt_row_ptr + (pos // BLOCK_SIZE) * stride_btc)
    return blk.to(tl.int64)  # block * stride_b overflows int32 on large caches


@triton.jit
def _load_kv(
    cache_ptr,
    blk,
    pos,
    pos_ok,
    kv_head,
    d,
    d_ok,
    stride_b,
    stride_s,
    stride_h,
    stride_d,
    BLOCK_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
    PAD_D: tl.constexpr,
):
    """[len(pos), HEAD_PAD] of one cache half at token indices `pos` (in blocks `blk`), read in place."""
    row = blk * stride_b + (pos % BLOCK_SIZE) * stride_s + kv_head * stride_h
    ptrs = cache_ptr + row[:, None] + d[None, :] * stride_d
    if MASKED:
        return tl.load(ptrs, mask=pos_ok[:, None] & d_ok[None, :], other=0.0)
    elif PAD_D:
        return tl.load(ptrs, mask=d_ok[None, :], other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _softmax_step(
    q,
    k,
    v,
    m_i,
    l_i,
    acc,
    allowed,
    qk_scale,
    HAS_MASK: tl.constexpr,
    GUARD: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One key tile of the online softmax (scores in log2 units, fp32 statistics and accumulator)."""
    if UPCAST:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
    else:
        s = tl.dot(q, tl.trans(k))
    s = s * qk_scale
    if HAS_MASK:
        s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if GUARD:
        # a row may see no allowed key yet (no prefix, a tile of other branches): subtract 0, not -inf - -inf
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_sub = m_new
    alpha = tl.exp2(m_i - m_sub)
    p = tl.exp2(s - m_sub[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    p = p.to(v.dtype)  # rounded as the GPU's half-precision dot sees it
    if UPCAST:
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float32), v.to(tl.float32))
    else:
        acc = tl.dot(p, v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["stride_btr", "num_words", "num_splits"])
def _tree_attention_kernel(
    q_ptr,
    o_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    tiles_ptr,
    bits_ptr,
    ws_acc_ptr,
    ws_ml_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_btr,
    stride_btc,
    num_words,
    num_splits,
    QPK: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    PAD_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TREE_N: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    tl.static_assert(TREE_N == 32)  # one int32 ancestor word per row and tree tile
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    desc = tiles_ptr + tile * 8
    req = tl.load(desc + 0)
    q_start = tl.load(desc + 1)
    n = tl.load(desc + 2)
    prefix = tl.load(desc + 3)
    bits_base = tl.load(desc + 4)
    row0 = tl.load(desc + 5)
    tree_end = tl.load(desc + 6)

    rows = row0 + tl.arange(0, BLOCK_M)
    node = rows // QPK
    head = kv_head * QPK + rows % QPK  # query head h reads kv head h // QPK
    row_ok = node < n
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < HEAD

    q_row = (q_start + node).to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_row[:, None] + d[None, :] * stride_qd, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    bt_row = bt_ptr + req.to(tl.int64) * stride_btr

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)

    # The shared prefix (split: this program's segment of it, whole key tiles): whole tiles unmasked, then the
    # partial one.
    if SPLIT:
        seg = tl.cdiv(tl.cdiv(prefix, num_splits), BLOCK_N) * BLOCK_N
        lo = split * seg
        hi = tl.minimum(lo + seg, prefix)
        tree_hi = tl.where(split == num_splits - 1, tree_end, 0)  # the last segment's program takes the tree
    else:
        lo = 0
        hi = prefix
        tree_hi = tree_end
    cols = tl.arange(0, BLOCK_N)
    full_end = lo + (tl.maximum(hi - lo, 0) // BLOCK_N) * BLOCK_N
    for start in range(lo, full_end, BLOCK_N):
        pos = start + cols
        blk = _block_ids(bt_row, stride_btc, pos, None, BLOCK_SIZE, False)
        k = _load_kv(k_ptr, blk, pos, None, kv_head, d, d_ok,
                     stride_kb, stride_ks, stride_kh, stride_kd, BLOCK_SIZE, False, PAD_D)  # fmt: skip
        v = _load_kv(v_ptr, blk, pos, None, kv_head, d, d_ok,
                     stride_vb, stride_vs, stride_vh, stride_vd, BLOCK_SIZE, False, PAD_D)  # fmt: skip
        m_i, l_i, acc = _softmax_step(q, k, v, m_i, l_i, acc, None, qk_scale, False, False, UPCAST)
    if full_end < hi:
        pos = full_end + cols
        pos_ok = pos < hi
        blk = _block_ids(bt_row, stride_btc, pos, pos_ok, BLOCK_SIZE, True)
        k = _load_kv(k_ptr, blk, pos, pos_ok, kv_head, d, d_ok,
                     stride_kb, stride_ks, stride_kh, stride_kd, BLOCK_SIZE, True, PAD_D)  # fmt: skip
        v = _load_kv(v_ptr, blk, pos, pos_ok, kv_head, d, d_ok,
                     stride_vb, stride_vs, stride_vh, stride_vd, BLOCK_SIZE, True, PAD_D)  # fmt: skip
        m_i, l_i, acc = _softmax_step(q, k, v, m_i, l_i, acc, pos_ok[None, :], qk_scale, True, False, UPCAST)

    # The tree's own keys: bit j of word w of node u's row is mask[u, 32 w + j].
    tcols = tl.arange(0, TREE_N)
    bits_row = bits_ptr + (bits_base + node).to(tl.int64) * num_words
    for v0 in range(0, tree_hi, TREE_N):
        vi = v0 + tcols
        v_ok = vi < n
        # rows past the tree get every bit (never stored; keeps their softmax finite)
        word = tl.load(bits_row + v0 // TREE_N, mask=row_ok, other=-1)
        allowed = (((word[:, None] >> tcols[None, :]) & 1) != 0) & v_ok[None, :]
        pos = prefix + vi
        blk = _block_ids(bt_row, stride_btc, pos, v_ok, BLOCK_SIZE, True)
        k = _load_kv(k_ptr, blk, pos, v_ok, kv_head, d, d_ok,
                     stride_kb, stride_ks, stride_kh, stride_kd, BLOCK_SIZE, True, PAD_D)  # fmt: skip
        v = _load_kv(v_ptr, blk, pos, v_ok, kv_head, d, d_ok,
                     stride_vb, stride_vs, stride_vh, stride_vd, BLOCK_SIZE, True, PAD_D)  # fmt: skip
        m_i, l_i, acc = _softmax_step(q, k, v, m_i, l_i, acc, allowed, qk_scale, True, True, UPCAST)

    if SPLIT:
        # unnormalised partials, one slot per (split, program, row); _combine_splits_kernel merges them
        slot = ((split * tl.num_programs(0) + tile) * tl.num_programs(1) + kv_head).to(tl.int64) * BLOCK_M
        slot = slot + tl.arange(0, BLOCK_M)
        tl.store(ws_acc_ptr + slot[:, None] * HEAD_PAD + d[None, :], acc)
        tl.store(ws_ml_ptr + slot * 2, m_i)
        tl.store(ws_ml_ptr + slot * 2 + 1, l_i)
    else:
        out = acc / l_i[:, None]
        o_row = (q_start + node).to(tl.int64) * stride_ot + head * stride_oh
        tl.store(
            o_ptr + o_row[:, None] + d[None, :] * stride_od,
            out.to(o_ptr.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )


@triton.jit(do_not_specialize=["num_splits"])
def _combine_splits_kernel(
    o_ptr,
    tiles_ptr,
    ws_acc_ptr,
    ws_ml_ptr,
    stride_ot,
    stride_oh,
    stride_od,
    num_splits,
    QPK: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """The split programs' partials of one (tile, kv head) merged into the tree rows of the output."""
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    desc = tiles_ptr + tile * 8
    q_start = tl.load(desc + 1)
    n = tl.load(desc + 2)
    row0 = tl.load(desc + 5)
    rows = row0 + tl.arange(0, BLOCK_M)
    node = rows // QPK
    head = kv_head * QPK + rows % QPK
    row_ok = node < n
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < HEAD

    stride_split = tl.num_programs(0) * tl.num_programs(1) * BLOCK_M
    slot = (tile * tl.num_programs(1) + kv_head).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in range(0, num_splits):
        m_max = tl.maximum(m_max, tl.load(ws_ml_ptr + (slot + s * stride_split) * 2))
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    for s in range(0, num_splits):
        at = slot + s * stride_split
        w = tl.exp2(tl.load(ws_ml_ptr + at * 2) - m_max)  # an empty segment: m -inf, weight 0
        l_sum += w * tl.load(ws_ml_ptr + at * 2 + 1)
        acc += w[:, None] * tl.load(ws_acc_ptr + at[:, None] * HEAD_PAD + d[None, :])
    out = acc / l_sum[:, None]
    o_row = (q_start + node).to(tl.int64) * stride_ot + head * stride_oh
    tl.store(
        o_ptr + o_row[:, None] + d[None, :] * stride_od,
        out.to(o_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


@cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


MAX_SPLITS = 16
MIN_SPLIT_KEYS = 512  # prefix keys a split program reads at least (shorter: the merge launch costs more)
LOAD_ROWS = 64  # a key tile's load, in rows' worth of compute (the cost model's only constant)


def choose_tiling(
    num_nodes: Sequence[int], prefixes: Sequence[int], queries_per_kv: int, num_kv_heads: int, num_sms: int
) -> tuple[int, int]:
    """(block_m, num_splits) for a step: the pair with the least modelled time.

    Programs run in waves (one a SM at BLOCK_M 128, two below); a program's time is its keys (prefix segment + tree)
    times (LOAD_ROWS + BLOCK_M), times the programs sharing its SM. Big tiles read each K/V tile for more rows;
    splitting the prefix over several programs (merged by a second launch) keeps the GPU busy when the step is a few
    trees over long prefixes. Tiles no taller than the largest tree's rows. Untuned: see the GPU script's --sweep."""
    if not num_nodes:
        return AUTO_BLOCK_M[-1], 1
    max_rows = max(num_nodes) * queries_per_kv
    max_prefix = max(prefixes)
    max_splits = max(1, min(MAX_SPLITS, max_prefix // MIN_SPLIT_KEYS))
    best = (float("inf"), AUTO_BLOCK_M[-1], 1)
    for bm in AUTO_BLOCK_M:  # largest first: ties keep the bigger tile
        if bm > max(AUTO_BLOCK_M[-1], triton.next_power_of_2(max_rows)):
            continue
        per_sm = 1 if bm >= 128 else 2
        base = sum(-(-n * queries_per_kv // bm) for n in num_nodes) * num_kv_heads
        for splits in range(1, max_splits + 1):
            programs = base * splits
            waves = -(-programs // (num_sms * per_sm))
            sharing = min(per_sm, -(-programs // num_sms))  # programs sharing an SM in a wave
            keys = -(-max_prefix // splits) + max(num_nodes)
            cost = waves * sharing * (LOAD_ROWS + bm) * keys
            if cost < best[0]:
                best = (cost, bm, splits)
    return best[1], best[2]


def launch_config(block_m: int, head_size: int) -> dict[str, int]:
    """BLOCK_N / num_warps / num_stages per tile height (untuned defaults; `gpu_tree_attention.py --sweep`)."""
    if block_m >= 128:
        return {"block_n": 64, "num_warps": 8, "num_stages": 2 if head_size > 64 else 3}
    return {"block_n": 64, "num_warps": 4, "num_stages": 3}


@dataclass(frozen=True)
class TreeBatch:
    """One step's tree rows as device descriptors, built once per step and read by every layer's launch.

    tiles: int32 [num_tiles, 8]: req_index, q_start, num_nodes, prefix_len, bits_base (the tree's first row in
    `bits`), row0 (first (node, head-in-group) row of the tile, node-major), tree_end (the tile's nodes attend no
    node at or past it), unused. bits: int32 [total_nodes, num_words], node u of a tree at row bits_base + u, bit j
    of word w set iff mask[u, 32 w + j]. Both are views of one device buffer (one host-to-device copy), uploaded
    without waiting for the stream (page-locked).
    """

    tiles: torch.Tensor
    bits: torch.Tensor
    num_tiles: int
    num_words: int
    block_m: int
    num_splits: int  # > 1: the prefix split over that many programs a tile, then merged (a second launch)
    num_heads: int
    num_kv_heads: int
    num_trees: int
    max_nodes: int

    @staticmethod
    def build(
        rows: Sequence[TreeRows],
        device: torch.device | str,
        *,
        num_heads: int,
        num_kv_heads: int,
        block_m: int | None = None,
        num_splits: int | None = None,
    ) -> TreeBatch:
        """Pack the trees' descriptors (masks are read on the host: pass CPU masks, a device mask would sync).

        block_m / num_splits: the tiling (default `choose_tiling` for this device's SM count)."""
        device = torch.device(device)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        qpk = num_heads // num_kv_heads
        num_trees = len(rows)
        n = np.array([t.num_nodes for t in rows], dtype=np.int64)
        if num_trees and n.min() < 1:
            raise ValueError("every tree needs at least its root")
        max_nodes = int(n.max()) if num_trees else 0
        num_words = max(1, -(-max_nodes // WORD_BITS))
        width = num_words * WORD_BITS
        prefixes = [t.seq_len - t.num_nodes for t in rows]
        if block_m is None or num_splits is None:
            auto_m, auto_splits = choose_tiling(n.tolist(), prefixes, qpk, num_kv_heads, _num_sms(device))
            block_m = auto_m if block_m is None else block_m
            num_splits = auto_splits if num_splits is None else num_splits
        if block_m not in BLOCK_M_CHOICES:
            raise ValueError(f"block_m must be one of {BLOCK_M_CHOICES}, got {block_m}")
        if not 1 <= num_splits <= MAX_SPLITS:
            raise ValueError(f"num_splits must be 1..{MAX_SPLITS}, got {num_splits}")

        masks = np.zeros((num_trees, max_nodes, width), dtype=bool)
        for i, t in enumerate(rows):
            m = t.mask
            if tuple(m.shape) != (t.num_nodes, t.num_nodes):
                raise ValueError(f"tree {i}: mask {tuple(m.shape)} for {t.num_nodes} nodes")
            masks[i, : t.num_nodes, : t.num_nodes] = m.numpy(force=True)
        node_ok = np.arange(max_nodes)[None, :] < n[:, None]
        # Little-endian bit order: node v lands on bit v % 32 of word v // 32.
        words = np.packbits(masks.reshape(num_trees, max_nodes, num_words, WORD_BITS), axis=-1, bitorder="little")
        words = np.ascontiguousarray(words).view("<u4").reshape(num_trees, max_nodes, num_words)
        bits = words[node_ok].view(np.int32)  # [total_nodes, num_words], trees one after another
        # One past the last attended node (from the words: the last non-zero one's bit length), then its running
        # max: a tile's bound is its last node's.
        nonzero = words != 0
        top = num_words - 1 - np.argmax(nonzero[..., ::-1], axis=-1)
        top_word = np.take_along_axis(words, top[..., None], axis=-1)[..., 0].astype(np.float64)
        last = np.where(nonzero.any(-1), top * WORD_BITS + np.frexp(top_word)[1], 0)  # frexp: exponent = bit length
        reach = np.maximum.accumulate(last, axis=1) if num_trees else last

        tiles_per_tree = -(-n * qpk // block_m)
        num_tiles = int(tiles_per_tree.sum())
        tree = np.repeat(np.arange(num_trees), tiles_per_tree)
        first_tile = np.cumsum(tiles_per_tree) - tiles_per_tree
        row0 = (np.arange(num_tiles) - first_tile[tree]) * block_m
        last_node = np.minimum(n[tree], (row0 + block_m - 1) // qpk + 1) - 1
        tiles = np.zeros((num_tiles, TILE_FIELDS), dtype=np.int64)
        tiles[:, 0] = np.array([t.req_index for t in rows], dtype=np.int64)[tree]
        tiles[:, 1] = np.array([t.q_start for t in rows], dtype=np.int64)[tree]
        tiles[:, 2] = n[tree]
        tiles[:, 3] = np.array(prefixes, dtype=np.int64)[tree]
        tiles[:, 4] = (np.cumsum(n) - n)[tree]
        tiles[:, 5] = row0
        tiles[:, 6] = reach[tree, last_node]
        if num_tiles and tiles[:, 3].min() < 0:
            raise ValueError("a tree's seq_len is below its num_nodes")

        # One buffer, one copy (`staging`: page-locked, so that the upload does not wait for the stream).
        size = tiles.size + bits.size
        host = host_empty(size, torch.int32, device)
        flat = host.numpy()
        flat[: tiles.size] = tiles.reshape(-1)
        flat[tiles.size :] = bits.reshape(-1)
        buf = upload(host, device)
        return TreeBatch(
            tiles=buf[: tiles.size].view(num_tiles, TILE_FIELDS),
            bits=buf[tiles.size :].view(-1, num_words),
            num_tiles=num_tiles,
            num_words=num_words,
            block_m=block_m,
            num_splits=num_splits,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            num_trees=num_trees,
            max_nodes=max_nodes,
        )


def tree_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    batch: TreeBatch,
    scale: float,
    output: torch.Tensor,
    *,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Write the tree rows of `output` for one layer; every other row of `output` is left as it is.

    query, output: [num_tokens, num_heads, head_size] (output may be [num_tokens, num_heads * head_size]);
    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_size], any strides;
    block_table: int32 [num_reqs, max_blocks] (vLLM's, indexed by TreeRows.req_index). Returns output.
    """
    num_tokens, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    if (num_heads, num_kv_heads) != (batch.num_heads, batch.num_kv_heads):
        raise ValueError(f"batch built for {batch.num_heads}/{batch.num_kv_heads} heads, layer has "
                         f"{num_heads}/{num_kv_heads}")  # fmt: skip
    if value_cache.shape != key_cache.shape or key_cache.shape[3] != head_size:
        raise ValueError(f"cache halves {tuple(key_cache.shape)} / {tuple(value_cache.shape)}, head {head_size}")
    out3 = output.view(num_tokens, num_heads, head_size)
    if batch.num_tiles == 0:
        return output
    cfg = launch_config(batch.block_m, head_size)
    block_n = block_n or cfg["block_n"]
    interpreted = query.device.type == "cpu"
    extra = {} if interpreted else {"num_warps": num_warps or cfg["num_warps"],
                                    "num_stages": num_stages or cfg["num_stages"]}  # fmt: skip
    head_pad = triton.next_power_of_2(head_size)
    split = batch.num_splits > 1
    if split:  # the partials: [splits, tiles, kv heads, BLOCK_M] rows (the caching allocator: no sync)
        slots = batch.num_splits * batch.num_tiles * num_kv_heads * batch.block_m
        ws_acc = torch.empty(slots, head_pad, dtype=torch.float32, device=query.device)
        ws_ml = torch.empty(slots, 2, dtype=torch.float32, device=query.device)
    else:
        ws_acc = ws_ml = batch.tiles  # not read
    _tree_attention_kernel[(batch.num_tiles, num_kv_heads, batch.num_splits)](
        query,
        out3,
        key_cache,
        value_cache,
        block_table,
        batch.tiles,
        batch.bits,
        ws_acc,
        ws_ml,
        scale * _LOG2E,
        *query.stride(),
        *out3.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        *block_table.stride(),
        batch.num_words,
        batch.num_splits,
        QPK=num_heads // num_kv_heads,
        HEAD=head_size,
        HEAD_PAD=head_pad,
        PAD_D=head_pad != head_size,
        BLOCK_SIZE=block_size,
        BLOCK_M=batch.block_m,
        BLOCK_N=block_n,
        TREE_N=WORD_BITS,
        SPLIT=split,
        # The interpreter's dot cannot multiply bfloat16 (numpy holds it as uint16): float32 there.
        UPCAST=interpreted and query.dtype == torch.bfloat16,
        **extra,
    )
    if split:
        _combine_splits_kernel[(batch.num_tiles, num_kv_heads)](
            out3,
            batch.tiles,
            ws_acc,
            ws_ml,
            *out3.stride(),
            batch.num_splits,
            QPK=num_heads // num_kv_heads,
            HEAD=head_size,
            HEAD_PAD=head_pad,
            BLOCK_M=batch.block_m,
            **({} if interpreted else {"num_warps": 4}),
        )
    return output


def variants() -> list[tuple[int, bool]]:
    """Every (BLOCK_M, split) a step's launch may compile: the tile heights `choose_tiling` picks from, with the
    prefix split (and then the merge kernel at that height) or not. Everything else the kernels specialise on is
    fixed by the model (head size and count, dtype, block size, the cache's strides) or not specialised
    (`do_not_specialize`)."""
    return [(bm, split) for bm in AUTO_BLOCK_M for split in (False, True)]


def warm_up(key_cache: torch.Tensor, value_cache: torch.Tensor, num_heads: int, scale: float) -> list[tuple[int, bool]]:
    """Launch every variant (`variants`) once on a one-node tree without a prefix, over one layer's cache halves (as
    `tree_attention` takes them): Triton compiles a variant at its first launch, seconds each, which would
    otherwise fall on the first requests. Reads block 0 of the cache and writes only a scratch output. Returns the
    variants launched."""
    device = key_cache.device
    _, _, num_kv_heads, head_size = key_cache.shape
    query = torch.zeros(1, num_heads, head_size, dtype=key_cache.dtype, device=device)
    block_table = torch.zeros(1, 1, dtype=torch.int32, device=device)
    rows = [TreeRows(0, 0, 1, 1, torch.zeros(1, dtype=torch.int32), torch.ones(1, 1, dtype=torch.bool))]
    launched = []
    for block_m, split in variants():
        batch = TreeBatch.build(rows, device, num_heads=num_heads, num_kv_heads=num_kv_heads, block_m=block_m,
                                num_splits=2 if split else 1)  # fmt: skip
        tree_attention(query, key_cache, value_cache, block_table, batch, scale, torch.empty_like(query))
        launched.append((block_m, split))
    return launched


def unsupported(head_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto") -> str | None:
    """None where the kernel runs such a layer, else why not (for a backend's `unsupported`)."""
    if kv_cache_dtype != "auto":
        return f"the Triton tree kernel reads unquantized caches only (kv_cache_dtype {kv_cache_dtype})"
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"the Triton tree kernel has no {dtype} path"
    if not 16 <= head_size <= 256:
        return f"the Triton tree kernel takes head sizes 16..256 (got {head_size})"
    return None
