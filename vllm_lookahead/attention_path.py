"""Which way a CPU attention layer computes a lookahead step: the one decision the attention patch delegates.

- No lookahead step under way, or no tree in it (plain runs, chains only, warm-up, encoder layers): vLLM's own
  forward, untouched.
- Trees, and the compiled kernel applies (`TreeAttentionPlan.build`): each row computed once, by the stock kernel
  for the plain rows and by the tree kernel for the tree rows. The plan is built at the step's first layer and
  kept on the step, so the step's other layers only run it.
- Trees otherwise: vLLM's forward over every row, then the tree rows recomputed in plain torch (the reference).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from vllm_lookahead import cpu_kv_cache, tree_attention
from vllm_lookahead import step as lookahead_step
from vllm_lookahead.tree_attention_plan import TreeAttentionPlan

if TYPE_CHECKING:
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl, CPUAttentionMetadata

_REFERENCE = "reference"  # plan cache marker: this metadata's layers use the plain-torch path


def forward(
    original: Callable[..., torch.Tensor],
    impl: CPUAttentionBackendImpl,
    layer: Attention,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    attn_metadata: CPUAttentionMetadata | None,
    output: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    from vllm.v1.attention.backend import AttentionType

    step = lookahead_step.current()
    if step is None or not step.attention_rows or attn_metadata is None or impl.attn_type != AttentionType.DECODER:
        return original(impl, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
    cpu_kv_cache.ensure_layout(layer, impl, kv_cache)
    plan = step.attention_plans.get(id(attn_metadata))
    if plan is None:
        fused_quant = any(a is not None for a in args) or any(v is not None for v in kwargs.values())
        built = None if fused_quant else TreeAttentionPlan.build(
            step.attention_rows, impl, layer, query, kv_cache, attn_metadata
        )  # fmt: skip
        plan = step.attention_plans[id(attn_metadata)] = built or _REFERENCE
    if plan is _REFERENCE:
        result = original(impl, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        tree_attention.attend_layer(step.attention_rows, layer, impl, query, kv_cache, output)
        return result
    plan.forward(layer, impl, query, kv_cache, output)
    return output


def used_kernel(step: lookahead_step.LookaheadStep) -> bool:
    """Whether the step's tree rows went through the compiled kernel (every attention group's)."""
    return bool(step.attention_plans) and all(p is not _REFERENCE for p in step.attention_plans.values())
