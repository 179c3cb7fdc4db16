"""Move accepted tree nodes' KV to the consecutive slots vLLM expects.

A tree node u of a request is written at the slot of position P+u (vLLM's linear slot mapping), but once
accepted at depth d it must live at P+d, where the next step (and prefix caching) will look for it. Its key
was already rotated for position P+d, so a copy is all it takes. All sources are read before any destination is
written, so overlapping moves (node 2 -> slot 1 while node 3 -> slot 2) are safe.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_lookahead.tree_attention import read_slots


def _attention_layers(runner: Any) -> list[Any]:
    layers = getattr(runner, "_lookahead_attn_layers", None)
    if layers is None:
        ctx = runner.compilation_config.static_forward_context
        layers = [m for m in ctx.values() if hasattr(m, "kv_cache") and hasattr(m, "impl")]
        runner._lookahead_attn_layers = layers
    return layers


def move_kv_slots(runner: Any, src: list[int], dst: list[int]) -> None:
    """For every attention layer, copy the KV at global cache slots `src` to slots `dst` (pairwise, in order)."""
    import vllm._custom_ops as ops

    src_t = torch.tensor(src, dtype=torch.long)
    dst_t = torch.tensor(dst, dtype=torch.long)
    for layer in _attention_layers(runner):
        kv_cache = layer.kv_cache
        if kv_cache is None or kv_cache.numel() == 0:
            continue
        num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
        key_cache, value_cache = kv_cache.view(num_blocks, num_kv_heads, 2 * block_size, -1).chunk(2, dim=2)
        # Global slots read through a flat "block table" 0..num_blocks-1.
        k, v = read_slots(key_cache, value_cache, _ALL_BLOCKS.get(num_blocks), src_t.tolist())
        ops.cpu_attn_reshape_and_cache(
            k,
            v,
            key_cache,
            value_cache,
            dst_t,
            layer.isa,
            k_scale=layer._k_scale_float,
            v_scale=layer._v_scale_float,
            kv_cache_dtype=layer.impl.kv_cache_dtype,
        )


class _Arange:
    def __init__(self) -> None:
        self._cache: dict[int, torch.Tensor] = {}

    def get(self, n: int) -> torch.Tensor:
        t = self._cache.get(n)
        if t is None:
            t = self._cache[n] = torch.arange(n, dtype=torch.int32)
        return t


_ALL_BLOCKS = _Arange()
