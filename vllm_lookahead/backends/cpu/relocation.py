"""Move accepted tree nodes' KV to the consecutive slots vLLM expects.

A tree node u of a request is written at the slot of position P+u (vLLM's linear slot mapping), but once
accepted at depth d it must live at P+d, where the next step (and prefix caching) will look for it. Its key
was already rotated for position P+d, so a copy is all it takes. All sources are read before any destination is
written, so overlapping moves (node 2 -> slot 1 while node 3 -> slot 2) are safe. Every layer's moves are one
call into the compiled library (`library.py`) where it applies; otherwise, and as the reference,
`move_kv_slots_reference` reads and writes each layer with torch and vLLM's own cache writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vllm_lookahead.backends.cpu import layouts as cpu_kv_cache
from vllm_lookahead.backends.cpu.library import CompiledLibrary
from vllm_lookahead.backends.cpu.plan import cache_readable

if TYPE_CHECKING:
    from vllm.model_executor.layers.attention import Attention


@dataclass
class CacheLayers:
    """The attention layers that own a KV cache, and the library that moves all their entries in one call (None where
    it does not apply)."""

    layers: list[Attention]
    library: CompiledLibrary | None
    caches: list[torch.Tensor]  # the layers' non-empty caches, in layer order: what one compiled call moves
    layout: int = 0  # their layout's kernel code (`layouts.Layout.kernel_code`), where compiled

    @property
    def compiled(self) -> bool:
        return self.library is not None

    @classmethod
    def of(cls, layers: Sequence[Attention], library: CompiledLibrary | None) -> CacheLayers:
        with_cache = [layer for layer in layers if _has_cache(layer)]
        caches = [layer.kv_cache for layer in with_cache]
        alike = all(
            c.shape == caches[0].shape and c.stride() == caches[0].stride() and c.dtype == caches[0].dtype
            for c in caches
        )
        compiled = library is not None and bool(caches) and alike
        compiled = compiled and all(compiled_moves_apply(layer) for layer in layers)
        codes = {cpu_kv_cache.layout_of(layer.isa).kernel_code for layer in with_cache} if compiled else set()
        compiled = compiled and len(codes) == 1  # one call moves one layout
        return cls(list(layers), library if compiled else None, caches, codes.pop() if compiled else 0)


def move_kv_slots(cache_layers: CacheLayers, src: Sequence[int], dst: Sequence[int]) -> None:
    """For every layer, copy the KV at global cache slots `src` to slots `dst` (pairwise)."""
    if cache_layers.library is not None:
        # one call: every layer, no torch op per layer
        cache_layers.library.move_slots(cache_layers.caches, src, dst, cache_layers.layout)
    else:
        move_kv_slots_reference(cache_layers.layers, src, dst)


def _has_cache(layer: Attention) -> bool:
    return layer.kv_cache is not None and layer.kv_cache.numel() > 0


def compiled_moves_apply(layer: Attention) -> bool:
    """Whether the kernel's copy moves this layer's cache entries exactly as vLLM's writer would: an unscaled cache
    in a layout it reads (`cpu_kv_cache`), each block's heads in contiguous memory."""
    if not _has_cache(layer):
        return True  # nothing to move
    kv = layer.kv_cache
    return cache_readable(layer.impl, layer, kv) and kv.dim() == 4 and kv.stride(3) == 1 and kv.stride(2) == kv.shape[3]


def move_kv_slots_reference(layers: Sequence[Attention], src: Sequence[int], dst: Sequence[int]) -> None:
    """The same moves layer by layer with torch and vLLM's own cache writer."""
    src_t = torch.tensor(src, dtype=torch.long)
    dst_t = torch.tensor(dst, dtype=torch.long)
    for layer in layers:
        kv_cache = layer.kv_cache
        if kv_cache is None or kv_cache.numel() == 0:
            continue
        key_cache, value_cache = cpu_kv_cache.split(kv_cache)
        k, v = cpu_kv_cache.read_cache_slots(key_cache, value_cache, src_t, layer.isa)
        cpu_kv_cache.layer_writer(layer)(k, v, key_cache, value_cache, dst_t)
