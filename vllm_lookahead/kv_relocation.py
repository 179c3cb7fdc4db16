"""Move accepted tree nodes' KV to the consecutive slots vLLM expects.

A tree node u of a request is written at the slot of position P+u (vLLM's linear slot mapping), but once
accepted at depth d it must live at P+d, where the next step (and prefix caching) will look for it. Its key
was already rotated for position P+d, so a copy is all it takes. All sources are read before any destination is
written, so overlapping moves (node 2 -> slot 1 while node 3 -> slot 2) are safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from vllm_lookahead import cpu_kv_cache

if TYPE_CHECKING:
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner


def attention_layers(runner: GPUModelRunner) -> list[Attention]:
    """The runner's attention layers (those that own a KV cache), found once."""
    layers = getattr(runner, "_lookahead_attn_layers", None)
    if layers is None:
        ctx = runner.compilation_config.static_forward_context
        layers = [m for m in ctx.values() if hasattr(m, "kv_cache") and hasattr(m, "impl")]
        runner._lookahead_attn_layers = layers
    return layers


def move_kv_slots(layers: Sequence[Attention], src: Sequence[int], dst: Sequence[int]) -> None:
    """For every layer, copy the KV at global cache slots `src` to slots `dst` (pairwise)."""
    src_t = torch.tensor(src, dtype=torch.long)
    dst_t = torch.tensor(dst, dtype=torch.long)
    for layer in layers:
        kv_cache = layer.kv_cache
        if kv_cache is None or kv_cache.numel() == 0:
            continue
        key_cache, value_cache = cpu_kv_cache.split(kv_cache)
        k, v = cpu_kv_cache.read_cache_slots(key_cache, value_cache, src_t)
        cpu_kv_cache.layer_writer(layer)(k, v, key_cache, value_cache, dst_t)
