"""Which attention backend runs lookahead on this engine, decided once at start-up and said once in the log, and the
model's layers it is confirmed on (`check_model_layers`: what no backend's trees serve).

The KV cache's layout follows from the platform and vLLM's choices: on a CPU, vLLM's CPU_ATTN picks an ISA per
dtype, block size, head size and host (`_get_attn_isa`, imported rather than copied, so the answer is vLLM's own).
The engine's settings may force the chain backend or keep the compiled CPU library out (`settings.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm_lookahead.backends import CacheSpec, TreeBackend, select
from vllm_lookahead.glue.cuda_graphs import describe
from vllm_lookahead.glue.settings import BACKEND_CHOICES, BACKEND_ENV, Settings

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner


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


def check_model_layers(runner: GPUModelRunner, layers: list[Any]) -> str | None:
    """Once the model is loaded, what of its layers no tree backend computes: why the engine runs chains (None:
    nothing). Layers with a recurrent state (vLLM's `MambaBase`: Mamba, linear attention, gated delta nets) raise,
    since chains would not restore their state either (the configuration check refuses such models earlier)."""
    from vllm.model_executor.layers.attention.chunked_local_attention import ChunkedLocalAttention
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    ctx = runner.compilation_config.static_forward_context
    recurrent = [f"{name} ({type(m).__name__})" for name, m in ctx.items() if isinstance(m, MambaBase)]
    if recurrent:
        raise ValueError(
            f"lookahead: the model has layers with a recurrent state ({', '.join(recurrent[:3])}"
            f"{', ...' if len(recurrent) > 3 else ''}): lookahead drafts only for models whose every layer is attention"
        )
    for layer in layers:
        if isinstance(layer, ChunkedLocalAttention):
            # its metadata builder splits each request into virtual batches of attention_chunk_size: a tree kernel
            # would read the whole prefix through the wrong block-table rows, while vLLM's own kernel runs chains
            return f"layer {layer.layer_name} runs chunked local attention (chunk {layer.attention_chunk_size})"
    if getattr(runner, "uses_mrope", False):
        return "the model's M-RoPE positions (tree positions are written for plain RoPE)"
    return None


def graph_modes(runner: GPUModelRunner, trees: bool) -> str | None:
    """On CUDA, the log line saying which graphs each kind of step runs under (`cuda_graphs.py`); None elsewhere."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return None
    dispatcher = getattr(runner, "cudagraph_dispatcher", None)
    mode = dispatcher.cudagraph_mode if dispatcher is not None else runner.compilation_config.cudagraph_mode
    return describe(mode, trees, runner.compilation_config.max_cudagraph_capture_size)
