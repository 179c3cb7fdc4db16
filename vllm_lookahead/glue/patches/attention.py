"""Attention: a lookahead step's tree rows get tree-masked attention from the engine's backend.

vLLM's kernels have no arbitrary mask. Each patched forward is a pass-through outside steps with trees (every run
without lookahead, warm-up, chains, encoder layers) and otherwise hands the layer to the step's backend.
"""

from __future__ import annotations

from vllm_lookahead.glue import step as lookahead_step
from vllm_lookahead.glue.patches.base import Patch


def _cpu_owner():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    return CPUAttentionBackendImpl


def _flash_owner():
    from vllm.v1.attention.backends.flash_attn import FlashAttentionImpl

    return FlashAttentionImpl


def _triton_owner():
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    return TritonAttentionImpl


def _on_cuda() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cuda()


def _forward(original):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs):
        """vLLM's forward of one attention layer: `args` / `kwargs` the output and its quantization scales, as vLLM
        passes them (by keyword from the attention layer, by position from composite backends)."""
        from vllm.v1.attention.backend import AttentionType

        step = lookahead_step.current()
        if step is None or not step.attention_rows or attn_metadata is None or self.attn_type != AttentionType.DECODER:
            return original(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs)
        return step.backend.attend(step.attention_rows, step.attention_plans, original, self, layer, query, key, value,
                                   kv_cache, attn_metadata, *args, **kwargs)  # fmt: skip

    return forward


# The CUDA backends' forward has the same signature (output_scale and output_block_scale travel in *args/**kwargs).
PATCHES = [
    Patch("cpu_attn.CPUAttentionBackendImpl.forward", _cpu_owner, "forward", _forward),
    Patch("flash_attn.FlashAttentionImpl.forward", _flash_owner, "forward", _forward, when=_on_cuda),
    Patch("triton_attn.TritonAttentionImpl.forward", _triton_owner, "forward", _forward, when=_on_cuda),
]
