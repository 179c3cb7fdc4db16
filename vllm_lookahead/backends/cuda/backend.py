"""The CUDA backend: tree rows on vLLM's FLASH_ATTN and TRITON_ATTN backends through the Triton kernel.

Those backends keep a layer's cache as [num_blocks, num_kv_heads, block_size, 2 * head_size] in logical order, laid
out block, token, head (K then V along the last dimension): `split` gives the key and value halves as
[num_blocks, block_size, num_kv_heads, head_size] views, as the backends take them. vLLM writes the step's K/V before
a layer's forward runs, so a layer's tree rows are vLLM's forward over every row (plain rows exact, tree rows causal)
and then the tree rows written again by `tree_kernel.tree_attention`, reading the cache in place. The kernel's
per-step descriptors are built at the step's first layer and kept in the step's `plans`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from vllm_lookahead.backends.base import CacheSpec, TreeBackend, TreeRows

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
        super().__init__()
        self._caches: dict[int, tuple[list[torch.Tensor], bool]] = {}

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
        return None

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
        caches = self._caches.get(id(layers))
        if caches is None:  # the engine passes the same list every step: looked at once
            from vllm_lookahead.backends.cuda import relocation

            found = [layer.kv_cache for layer in layers if layer.kv_cache is not None and layer.kv_cache.numel()]
            caches = self._caches[id(layers)] = (found, relocation.cells_alike(found))
        found, alike = caches
        if alike:
            from vllm_lookahead.backends.cuda import relocation

            relocation.move_cells(found, src, dst)
            return
        index = None
        for kv in found:
            if index is None:
                both = torch.tensor([list(src), list(dst)], dtype=torch.long).to(kv.device, non_blocking=True)
                index = (both // kv.shape[2], both % kv.shape[2])
            blocks, offsets = index
            cells = kv.transpose(1, 2)  # [num_blocks, block_size, num_kv_heads, 2 * head_size]
            cells[blocks[1], offsets[1]] = cells[blocks[0], offsets[0]]

    def used_kernel(self, plans: dict[int, object]) -> bool:
        return bool(plans)


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
