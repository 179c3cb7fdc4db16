"""One step's attention with lookahead trees, computed once per row: the fast path of the CPU attention layer.

Built at the step's first decoder layer (per attention metadata) and used by every layer of that step:
- every tree row goes to the compiled kernel (`library.py`), which reads the request's cached prefix and the
  row's ancestors in place from the paged cache, by one call per layer with a prepared argument block;
- so do the other requests' rows where there are few of them (a decoding row, a chain of drafts: causal rows, at
  most PLAIN_ROWS_IN_KERNEL), where the layout says the kernel computes them faster than vLLM's stock kernel
  (`layouts.Layout.kernel_takes_plain_rows`);
- the remaining plain rows (prompts) go to vLLM's stock kernel, compacted: their query rows, query offsets,
  sequence lengths and block table rows, with the kernel's scheduler metadata built for them.
So no row is computed twice, nothing is gathered or upcast, and per layer Python makes one call (at most three
where a prompt shares the step).
`TreeAttentionPlan.build` (given the loaded library) returns None where this path does not apply (ALiBi, soft-cap,
sliding window, sinks, a quantized KV cache, another dtype or a cache layout it does not read); the caller then uses
the plain-torch path, as it does without the library. The kernel reads the layouts `layouts` describes (vec / vec16,
amx), told which by its arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm_lookahead.backends.base import TreeRows
from vllm_lookahead.backends.cpu import layouts
from vllm_lookahead.backends.cpu.layouts import split
from vllm_lookahead.backends.cpu.library import ARGS, HEAD_SIZES, CompiledLibrary

if TYPE_CHECKING:
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl, CPUAttentionMetadata

MAX_NODES_PER_ITEM = 16  # a work item's rows are at most this many nodes x the query heads of one KV head
# A plain request with at most this many query rows (decoding, a chain of drafts) goes to the compiled kernel in a
# step with trees, as a causal tree: cheaper than gathering those rows for the stock kernel and scattering them back
# (docs/results.md, "Tuned constants"). Longer prompts stay on the stock kernel, whose masks need no bitsets.
PLAIN_ROWS_IN_KERNEL = MAX_NODES_PER_ITEM


@dataclass(frozen=True)
class CausalRows:
    """A plain request's query rows (decoding, or a chain), each attending its prefix and the rows before it."""

    req_index: int
    q_start: int
    num_nodes: int
    seq_len: int


def ancestor_bitsets(mask: torch.Tensor, words: int) -> np.ndarray:
    """[n, words] uint64: bit v of row u is mask[u, v] (node u attends node v)."""
    bits = np.packbits(mask.numpy(), axis=1, bitorder="little")
    padded = np.zeros((mask.shape[0], words * 8), np.uint8)
    padded[:, : bits.shape[1]] = bits
    return padded.view("<u8")


@cache
def causal_bitsets(n: int, words: int) -> np.ndarray:
    """[n, words] uint64: row u attends rows 0..u (a chain's ancestor bitsets)."""
    return ancestor_bitsets(torch.ones(n, n, dtype=torch.bool).tril(), words)


def work_items(
    trees: Sequence[TreeRows | CausalRows], num_kv_heads: int, num_threads: int
) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's work items ([items, 8] int32: q_start, n, prefix, first node, end node, mask row, KV head,
    request row) and the ancestor bitsets of all trees' nodes, stacked (a plain request's: causal).

    A tree is cut into chunks of at most MAX_NODES_PER_ITEM nodes, into more where there are too few items to keep
    every thread busy; items are ordered biggest first for the kernel's dynamic schedule.
    """
    sizes = [t.num_nodes for t in trees]
    words = (max(sizes) + 63) // 64
    masks = np.concatenate(
        [
            ancestor_bitsets(t.mask, words) if isinstance(t, TreeRows) else causal_bitsets(t.num_nodes, words)
            for t in trees
        ]
    )
    chunks = [-(-n // MAX_NODES_PER_ITEM) for n in sizes]
    total = sum(chunks) * num_kv_heads
    if total < 2 * num_threads:
        factor = -(-2 * num_threads // total)
        chunks = [min(n, c * factor) for n, c in zip(sizes, chunks, strict=True)]
    items = []
    mask_row = 0
    for t, n, c in zip(trees, sizes, chunks, strict=True):
        bounds = [(j * n) // c for j in range(c + 1)]
        prefix = t.seq_len - n
        for h in range(num_kv_heads):
            items += [(t.q_start, n, prefix, bounds[j], bounds[j + 1], mask_row, h, t.req_index) for j in range(c)]
        mask_row += n
    items.sort(key=lambda it: -(it[4] - it[3]) * (it[2] + it[1]))
    return np.array(items, np.int32), masks


def cache_readable(impl: CPUAttentionBackendImpl, layer: Attention, kv_cache: torch.Tensor) -> bool:
    """Whether the compiled kernel reads (and moves) this layer's cache as vLLM wrote it: an unscaled cache of a
    dtype and shape that a layout it knows holds (`layouts`: vec / vec16 float32 or bfloat16, amx bfloat16)."""
    return (
        kv_cache.dim() == 4
        and impl.kv_cache_dtype == "auto"
        and layouts.readable(getattr(layer, "isa", None), kv_cache.dtype, kv_cache.shape[3] // 2, kv_cache.shape[2])
    )


def supports(
    kernel: CompiledLibrary,
    impl: CPUAttentionBackendImpl,
    layer: Attention,
    query: torch.Tensor,
    kv_cache: torch.Tensor,
) -> bool:
    """Whether the compiled kernel computes this layer's tree rows exactly as the stock kernel would."""
    return (
        cache_readable(impl, layer, kv_cache)
        and kv_cache.dtype == query.dtype
        and query.stride(-1) == 1
        and impl.alibi_slopes is None
        and not impl.logits_soft_cap
        and impl.sinks is None
        and impl.sliding_window == -1
        and impl.head_size in HEAD_SIZES
        and kv_cache.shape[2] % kernel.vector_width == 0
    )


@dataclass
class PlainRows:
    """The requests without a tree, as their own batch for the stock kernel."""

    rows: torch.Tensor  # long: their query rows in the step's batch
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    scheduler_metadata: torch.Tensor


@dataclass
class TreeAttentionPlan:
    kernel: CompiledLibrary
    args: np.ndarray  # int64, library.ARGS; the strides are filled in by the first layer
    keep: tuple[object, ...]  # what the args point into
    num_tokens: int
    plain: PlainRows | None
    strides: tuple[int, ...] = ()

    @classmethod
    def build(
        cls,
        kernel: CompiledLibrary,
        trees: Sequence[TreeRows],
        impl: CPUAttentionBackendImpl,
        layer: Attention,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: CPUAttentionMetadata,
    ) -> TreeAttentionPlan | None:
        if attn_metadata.causal is not True or attn_metadata.dynamic_causal is not None:
            return None
        if not supports(kernel, impl, layer, query, kv_cache):
            return None
        qsl = attn_metadata.query_start_loc.numpy()
        seq_lens = attn_metadata.seq_lens
        seq = seq_lens.numpy()
        for t in trees:
            r = t.req_index
            if qsl[r] != t.q_start or qsl[r + 1] - qsl[r] != t.num_nodes or seq[r] != t.seq_len:
                raise RuntimeError(f"vllm-lookahead: a tree's rows do not match the attention metadata ({t})")
        causal = _causal_rows(trees, layer, qsl, seq, attn_metadata.num_actual_tokens)
        items, masks = work_items([*trees, *causal], impl.num_kv_heads, torch.get_num_threads())
        block_table = attn_metadata.block_table
        if block_table.dtype != torch.int32 or not block_table.is_contiguous():
            block_table = block_table.to(torch.int32).contiguous()
        args = np.zeros(len(ARGS), np.int64)
        values = dict(
            items=items.ctypes.data,
            num_items=len(items),
            block_table=block_table.data_ptr(),
            block_table_stride=block_table.stride(0),
            masks=masks.ctypes.data,
            mask_words=masks.shape[1],
            scale_bits=int(np.float32(impl.scale).view(np.int32)),
            block_size=kv_cache.shape[2],
            head_size=impl.head_size,
            queries_per_kv=impl.num_heads // impl.num_kv_heads,
            bf16=int(query.dtype == torch.bfloat16),
            max_rows=int((items[:, 4] - items[:, 3]).max()) * (impl.num_heads // impl.num_kv_heads),
            parallel=1,
            layout=layouts.layout_of(layer.isa).kernel_code,
        )
        for name, value in values.items():
            args[ARGS.index(name)] = value
        num_tokens = attn_metadata.num_actual_tokens
        plain = _plain_rows([*trees, *causal], impl, layer, query.dtype, attn_metadata, num_tokens)
        return cls(kernel, args, (items, masks, block_table), num_tokens, plain)

    def forward(
        self,
        layer: Attention,
        impl: CPUAttentionBackendImpl,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        output: torch.Tensor,
    ) -> None:
        """This layer's attention for every row of the step: `output[:num_tokens]` written, nothing else."""
        n = self.num_tokens
        out3 = output.view(output.shape[0], impl.num_heads, impl.head_size)
        if self.plain is not None:
            from vllm import _custom_ops as ops

            p = self.plain
            key_cache, value_cache = split(kv_cache)
            q = query.index_select(0, p.rows)
            o = torch.empty_like(q)
            ops.cpu_attention_with_kv_cache(
                query=q,
                key_cache=key_cache,
                value_cache=value_cache,
                output=o,
                query_start_loc=p.query_start_loc,
                seq_lens=p.seq_lens,
                scale=impl.scale,
                causal=True,
                alibi_slopes=None,
                sliding_window=-1,
                block_table=p.block_table,
                softcap=0.0,
                scheduler_metadata=p.scheduler_metadata,
                s_aux=None,
                dynamic_causal=None,
                k_scale=layer._k_scale_float,
                v_scale=layer._v_scale_float,
                kv_cache_dtype=impl.kv_cache_dtype,
            )
            out3[:n].index_copy_(0, p.rows, o)
        strides = (query.stride(0), query.stride(1), kv_cache.stride(0), kv_cache.stride(1))
        strides += (out3.stride(0), out3.stride(1))
        if strides != self.strides:  # the same for every layer of a step: set at the first
            if out3.stride(2) != 1 or kv_cache.stride(3) != 1 or kv_cache.stride(2) != kv_cache.shape[3]:
                raise RuntimeError("vllm-lookahead: unexpected attention tensor layout for the tree kernel")
            self.args[ARGS.index("q_stride0") :] = strides
            self.strides = strides
        self.kernel.layer(self.args.ctypes.data, query.data_ptr(), kv_cache.data_ptr(), out3.data_ptr())


def _causal_rows(
    trees: Sequence[TreeRows], layer: Attention, qsl: np.ndarray, seq: np.ndarray, num_tokens: int
) -> list[CausalRows]:
    """The plain requests the compiled kernel computes beside the trees: those of at most PLAIN_ROWS_IN_KERNEL rows,
    where the layout says so."""
    if not layouts.layout_of(layer.isa).kernel_takes_plain_rows:
        return []
    num_reqs = len(qsl) - 1
    in_trees = {t.req_index for t in trees}
    rows = []
    for r in range(num_reqs):
        n = int(qsl[r + 1] - qsl[r])
        if r not in in_trees and 0 < n <= PLAIN_ROWS_IN_KERNEL and qsl[r + 1] <= num_tokens:
            rows.append(CausalRows(r, int(qsl[r]), n, int(seq[r])))
    return rows


def _plain_rows(
    trees: Sequence[TreeRows | CausalRows],
    impl: CPUAttentionBackendImpl,
    layer: Attention,
    dtype: torch.dtype,
    attn_metadata: CPUAttentionMetadata,
    num_tokens: int,
) -> PlainRows | None:
    from vllm import _custom_ops as ops
    from vllm import envs

    num_reqs = attn_metadata.query_start_loc.shape[0] - 1
    plain = np.ones(num_reqs, bool)
    plain[[t.req_index for t in trees]] = False
    if not plain.any():
        return None
    reqs = torch.from_numpy(np.flatnonzero(plain))
    is_tree_row = np.zeros(num_tokens, bool)
    for t in trees:
        is_tree_row[t.q_start : t.q_start + t.num_nodes] = True
    qsl = attn_metadata.query_start_loc
    lengths = (qsl[1:] - qsl[:-1])[reqs]
    query_start_loc = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(lengths, 0, dtype=torch.int32)
    seq_lens = attn_metadata.seq_lens[reqs].contiguous()
    sched = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(reqs),
        num_heads=impl.num_heads,
        num_kv_heads=impl.num_kv_heads,
        head_dim=impl.head_size,
        seq_lens=seq_lens,
        dtype=dtype,
        query_start_loc=query_start_loc,
        causal=True,
        sliding_window_size=-1,
        isa=layer.isa,
        enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV,
        dynamic_causal=None,
        kv_cache_dtype=impl.kv_cache_dtype,
    )
    rows = torch.from_numpy(np.flatnonzero(~is_tree_row))
    block_table = attn_metadata.block_table[reqs].contiguous()
    return PlainRows(rows, query_start_loc, seq_lens, block_table, sched)
