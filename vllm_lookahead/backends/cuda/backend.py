"""The CUDA backend: tree rows on vLLM's FLASH_ATTN and TRITON_ATTN backends through the Triton kernel.

Those backends keep a layer's cache as [num_blocks, num_kv_heads, block_size, 2 * head_size] in logical order, laid
out block, token, head (K then V along the last dimension): `split` gives the key and value halves as
[num_blocks, block_size, num_kv_heads, head_size] views, as the backends take them. vLLM writes the step's K/V before
a layer's forward runs, so a layer's tree rows are vLLM's forward over every row (plain rows exact, tree rows causal)
and then the tree rows written again by `tree_kernel.tree_attention`, reading the cache in place. The kernel's
per-step descriptors are built once the step is scheduled, before its forward pass (`prepare`: one upload per head
shape), and kept in the step's `plans`. Nothing of a step waits for the GPU here: descriptors and KV moves go up in
one copy each from page-locked memory (`staging`), logits rows are read on the device (`DeviceLogitRows`), and every
kernel variant is compiled before the first request (`warm_up`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from vllm_lookahead.backends.base import CacheSpec, TreeBackend, TreeRows
from vllm_lookahead.backends.logit_rows import DeviceLogitRows

# vLLM's attention backends whose caches the kernel reads ("auto": the one vLLM picks, confirmed on the layers).
BACKENDS = ("FLASH_ATTN", "TRITON_ATTN")
IMPLS = ("FlashAttentionImpl", "TritonAttentionImpl")
DTYPES = (torch.float16, torch.bfloat16)


def split(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value halves of a layer's cache, [num_blocks, block_size, num_kv_heads, head_size] views."""
    key_cache, value_cache = kv_cache.transpose(1, 2).split(head_size, dim=-1)
    return key_cache, value_cache


class CudaTreeBackend(TreeBackend):
    name = "cuda"

    def __init__(self) -> None:
        super().__init__(DeviceLogitRows())
        # per list of layers (the engine passes the same list every step): their caches and, where alike, the table
        # that moves their cells in two launches
        self._caches: dict[int, tuple[list[torch.Tensor], Any]] = {}
        # the layers' (num_heads, num_kv_heads) and device, once `check_layers` has seen them: `prepare` builds each
        # head shape's descriptors before the forward pass
        self._heads: set[tuple[int, int]] = set()
        self._device: torch.device | None = None

    @classmethod
    def unsupported(cls, spec: CacheSpec) -> str | None:
        if spec.platform != "cuda":
            return f"the CUDA backend serves CUDA GPUs, not {spec.platform}"
        if spec.layout not in ("auto", *BACKENDS):
            return f"no tree path for vLLM's {spec.layout} attention backend (trees run on {' and '.join(BACKENDS)})"
        if spec.dtype not in DTYPES:
            return f"the {spec.dtype} model (the CUDA tree path runs float16 and bfloat16)"
        try:
            from vllm_lookahead.backends.cuda import tree_kernel
        except ImportError as e:  # no Triton
            return f"the Triton tree kernel cannot load ({e})"
        return tree_kernel.unsupported(spec.head_size, spec.dtype, spec.kv_cache_dtype)

    def check_layers(self, layers: Sequence[Any]) -> str | None:
        for layer in layers:
            impl = layer.impl
            kind = type(impl).__name__
            if kind not in IMPLS:
                return f"layer {getattr(layer, 'layer_name', '?')} runs {kind}, not {' or '.join(BACKENDS)}"
            if why := _unsupported_impl(layer, impl):
                return f"layer {getattr(layer, 'layer_name', '?')}: {why}"
        self._heads = {(layer.impl.num_heads, layer.impl.num_kv_heads) for layer in layers}
        caches = [layer.kv_cache for layer in layers if _has_cache(layer)]
        self._device = caches[0].device if caches else None
        return None

    def prepare(self, rows: Sequence[TreeRows], plans: dict[int, object]) -> None:
        """Each head shape's descriptors (`TreeBatch`), built and uploaded before the forward pass."""
        if self._device is None:
            return  # layers not seen yet: `attend` builds them at the step's first layer
        from vllm_lookahead.backends.cuda import tree_kernel

        for heads in self._heads:
            plans[hash(heads)] = tree_kernel.TreeBatch.build(
                rows, self._device, num_heads=heads[0], num_kv_heads=heads[1]
            )

    def warm_up(self, layers: Sequence[Any]) -> str | None:
        """Every kernel variant a step can launch compiled now (`tree_kernel.warm_up`, `relocation.warm_up`), on one
        layer's cache per head shape and dtype, with nothing of the caches changed."""
        from vllm_lookahead.backends.cuda import relocation, tree_kernel

        seen: set[tuple[int, int, torch.dtype]] = set()
        tree = 0
        for layer in layers:
            impl = layer.impl
            if not _has_cache(layer) or (key := (impl.num_heads, impl.num_kv_heads, layer.kv_cache.dtype)) in seen:
                continue
            seen.add(key)
            key_cache, value_cache = split(layer.kv_cache, impl.head_size)
            tree += len(tree_kernel.warm_up(key_cache, value_cache, impl.num_heads, impl.scale))
        _, table = self._table(layers)
        moves = len(relocation.warm_up(table)) if table is not None else 0
        if not tree and not moves:
            return None
        return f"{tree} tree-attention kernel variants and {moves} KV-move variants compiled"

    def attend(
        self,
        rows: Sequence[TreeRows],
        plans: dict[int, object],
        original: Callable[..., torch.Tensor],
        impl: Any,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: Any,
        output: torch.Tensor,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        from vllm_lookahead.backends.cuda import tree_kernel

        if any(a is not None for a in args) or any(v is not None for v in kwargs.values()):
            raise RuntimeError("vllm-lookahead: tree rows with fused output quantization (the engine runs chains)")
        result = original(impl, layer, query, key, value, kv_cache, attn_metadata, output)
        heads = (impl.num_heads, impl.num_kv_heads)
        batch = plans.get(hash(heads))
        if batch is None:  # once per step (per head shape): one upload of every tree's descriptors
            batch = plans[hash(heads)] = tree_kernel.TreeBatch.build(
                rows, query.device, num_heads=heads[0], num_kv_heads=heads[1]
            )
        key_cache, value_cache = split(kv_cache, impl.head_size)
        q = query.view(query.shape[0], impl.num_heads, impl.head_size)
        tree_kernel.tree_attention(q, key_cache, value_cache, attn_metadata.block_table, batch, impl.scale, output)
        return result

    def relocate(self, layers: Sequence[Any], src: Sequence[int], dst: Sequence[int]) -> None:
        """Every layer's K/V at slots `src` copied to `dst`, every source read before anything is written: two
        launches for all layers (`relocation.move_cells`), or a gather and a scatter a layer where the caches differ
        in shape, dtype or strides."""
        if not src:
            return
        from vllm_lookahead.backends.cuda import relocation

        found, table = self._table(layers)
        if table is not None:
            relocation.move_cells(table, src, dst)
            return
        index = None
        for kv in found:
            if index is None:  # one upload for every layer (all share the first layer's block size or differ anyway)
                index = relocation.move_indices(src, dst, kv.shape[2], kv.device)
            cells = kv.transpose(1, 2)  # [num_blocks, block_size, num_kv_heads, 2 * head_size]
            cells[index[1, 0], index[1, 1]] = cells[index[0, 0], index[0, 1]]

    def _table(self, layers: Sequence[Any]) -> tuple[list[torch.Tensor], Any]:
        """The layers' caches and their `relocation.Cells` table (None where they differ), looked at once per list of
        layers (the engine passes the same list every step)."""
        caches = self._caches.get(id(layers))
        if caches is None:
            from vllm_lookahead.backends.cuda import relocation

            found = [layer.kv_cache for layer in layers if _has_cache(layer)]
            caches = self._caches[id(layers)] = (found, relocation.Cells.of(found))
        return caches

    def used_kernel(self, plans: dict[int, object]) -> bool:
        return bool(plans)


def _has_cache(layer: Any) -> bool:
    kv = getattr(layer, "kv_cache", None)
    return isinstance(kv, torch.Tensor) and kv.numel() > 0


def _unsupported_impl(layer: Any, impl: Any) -> str | None:
    """What of a layer the kernel does not compute as vLLM's kernel would (then the engine runs chains)."""
    from vllm_lookahead.backends.cuda import tree_kernel

    window = getattr(impl, "sliding_window", None)
    if window not in (None, -1, (-1, -1)):
        return f"sliding window {window}"
    if getattr(impl, "alibi_slopes", None) is not None:
        return "ALiBi"
    if getattr(impl, "sinks", None) is not None:
        return "attention sinks"
    if getattr(impl, "logits_soft_cap", None):
        return "logit soft-capping"
    if getattr(impl, "dcp_world_size", 1) > 1:
        return "decode context parallelism"
    if getattr(layer, "kv_sharing_target_layer_name", None):
        return "a KV cache shared with another layer"
    kv = getattr(layer, "kv_cache", None)
    if kv is not None and kv.numel() and (kv.dim() != 4 or kv.shape[3] != 2 * impl.head_size):
        return f"a KV cache of shape {tuple(kv.shape)}"
    dtype = kv.dtype if kv is not None and kv.numel() else torch.bfloat16
    return tree_kernel.unsupported(impl.head_size, dtype, getattr(impl, "kv_cache_dtype", "auto"))
