"""The CPU backend (vLLM's CPU_ATTN): tree rows on the paged CPU KV cache.

How a layer of a step with trees is computed:
- the compiled kernel applies (`TreeAttentionPlan.build`): each row computed once, by the tree kernel for the tree
  rows (and, where the layout says so, the other requests' few rows) and by vLLM's stock kernel for the prompts.
  The plan is built at the step's first layer and kept in the step's `plans`, so the step's other layers only run it;
- otherwise: vLLM's forward over every row, then the tree rows recomputed in plain torch (`reference`).
Accepted nodes' KV moves through `relocation`. Which caches it reads: `layouts`. Logits rows' argmax and top tokens
come from the same compiled library (`logit_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from vllm_lookahead.backends.base import CacheSpec, TreeBackend, TreeRows
from vllm_lookahead.backends.cpu import layouts, library, reference, relocation
from vllm_lookahead.backends.cpu.logit_rows import CompiledRows
from vllm_lookahead.backends.cpu.plan import TreeAttentionPlan

if TYPE_CHECKING:
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl, CPUAttentionMetadata

_REFERENCE = "reference"  # plan cache marker: this metadata's layers use the plain-torch path


class CpuTreeBackend(TreeBackend):
    name = "cpu"

    def __init__(self, compiled: library.CompiledLibrary | None = None) -> None:
        """compiled: the library the tree rows, KV moves and logits rows run on (None: plain torch and numpy)."""
        super().__init__(None if compiled is None else CompiledRows(compiled))
        self.library = compiled
        self._layers: dict[int, relocation.CacheLayers] = {}

    @classmethod
    def create(cls, compiled: bool = True) -> CpuTreeBackend:
        return cls(library.load() if compiled else None)

    @classmethod
    def unsupported(cls, spec: CacheSpec) -> str | None:
        if spec.platform != "cpu":
            return f"the CPU backend serves CPUs, not {spec.platform}"
        return layouts.unsupported(spec)

    def attend(
        self,
        rows: Sequence[TreeRows],
        plans: dict[int, object],
        original: Callable[..., torch.Tensor],
        impl: CPUAttentionBackendImpl,
        layer: Attention,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: CPUAttentionMetadata,
        output: torch.Tensor,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        layouts.ensure_layout(layer, impl, kv_cache)
        plan = plans.get(id(attn_metadata))
        if plan is None:
            fused_quant = any(a is not None for a in args) or any(v is not None for v in kwargs.values())
            built = None
            if not fused_quant and self.library is not None:
                built = TreeAttentionPlan.build(self.library, rows, impl, layer, query, kv_cache, attn_metadata)
            plan = plans[id(attn_metadata)] = built or _REFERENCE
        if plan is _REFERENCE:
            result = original(impl, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
            reference.attend_layer(rows, layer, impl, query, kv_cache, output)
            return result
        plan.forward(layer, impl, query, kv_cache, output)
        return output

    def relocate(self, layers: Sequence[Attention], src: Sequence[int], dst: Sequence[int]) -> None:
        found = self._layers.get(id(layers))
        if found is None:  # the engine passes the same list every step: checked once
            found = self._layers[id(layers)] = relocation.CacheLayers.of(layers, self.library)
        relocation.move_kv_slots(found, src, dst)

    def used_kernel(self, plans: dict[int, object]) -> bool:
        return bool(plans) and all(p is not _REFERENCE for p in plans.values())
