"""Which attention backend runs lookahead on this engine, decided once at start-up and said once in the log, and the
model's attention layers it is confirmed on.

The KV cache's layout follows from the platform and vLLM's choices: on a CPU, vLLM's CPU_ATTN picks an ISA per
dtype, block size, head size and host (`_get_attn_isa`, imported rather than copied, so the answer is vLLM's own).
The engine's settings may force the chain backend or keep the compiled CPU library out (`settings.py`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from vllm_lookahead.backends import CacheSpec, TreeBackend, select
from vllm_lookahead.glue.settings import BACKEND_CHOICES, BACKEND_ENV, Settings

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

logger = logging.getLogger("vllm_lookahead")


def cache_spec(vllm_config: VllmConfig) -> CacheSpec:
    """The model's KV cache as the attention backends see it."""
    from vllm.platforms import current_platform

    model_config, cache_config = vllm_config.model_config, vllm_config.cache_config
    dtype = model_config.dtype
    head_size = model_config.get_head_size()
    block_size = cache_config.block_size
    kv_dtype = cache_config.cache_dtype
    if current_platform.is_cpu():
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        try:
            layout = _get_attn_isa(dtype, block_size, head_size, kv_dtype)
        except NotImplementedError as e:  # vLLM itself cannot run this cache; it will say so
            layout = f"none ({e})"
        return CacheSpec("cpu", layout, dtype, kv_dtype, head_size, block_size)
    if current_platform.is_cuda():
        # vLLM picks each layer's attention backend while loading the model, after this runs: "auto" unless the user
        # named one; the engine confirms the pick on the real layers (`LookaheadEngine.confirm_backend`).
        forced = vllm_config.attention_config.backend
        return CacheSpec("cuda", forced.name if forced is not None else "auto", dtype, kv_dtype, head_size, block_size)
    platform = getattr(current_platform, "device_type", "") or "unknown"
    return CacheSpec(platform, "unknown", dtype, kv_dtype, head_size, block_size)


def choose_backend(vllm_config: VllmConfig, settings: Settings) -> tuple[TreeBackend, str]:
    """The engine's backend, and which path lookahead takes and why (the engine logs it once confirmed)."""
    if settings.backend not in BACKEND_CHOICES:
        choices = ", ".join(BACKEND_CHOICES)
        raise ValueError(f"vllm-lookahead: {BACKEND_ENV}={settings.backend!r}; expected one of {choices}")
    forced = f"{BACKEND_ENV}=chain" if settings.backend == "chain" else None
    if forced is None and getattr(vllm_config.compilation_config.pass_config, "fuse_attn_quant", False):
        forced = "attention is fused with output quantization (fuse_attn_quant): the tree rows would not be"
    return select(cache_spec(vllm_config), force_chains=forced, compiled=settings.compiled)


def attention_layers(runner: GPUModelRunner) -> list[Any]:
    """The runner's attention layers that own a KV cache, once vLLM has allocated the caches."""
    ctx = runner.compilation_config.static_forward_context
    return [m for m in ctx.values() if hasattr(m, "kv_cache") and hasattr(m, "impl")]


def attention_outside_graphs(vllm_config: VllmConfig) -> None:
    """On CUDA, steps with trees must run attention eagerly (vLLM's full CUDA graphs capture attention, and a replay
    would never reach the tree kernel): full modes become PIECEWISE, where attention runs between the captured
    pieces, or NONE where attention is not a splitting op. Said once in the log."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return
    cc = vllm_config.compilation_config
    mode = cc.cudagraph_mode
    if mode is None or not mode.has_full_cudagraphs():
        return
    cc.cudagraph_mode = CUDAGraphMode.PIECEWISE if cc.splitting_ops_contain_attention() else CUDAGraphMode.NONE
    logger.info(
        "lookahead: CUDA graph mode %s -> %s (tree attention runs outside captured graphs)", mode.name,
        cc.cudagraph_mode.name,
    )  # fmt: skip
