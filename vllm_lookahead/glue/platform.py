"""Which attention backend runs lookahead on this engine, decided once at start-up and said once in the log.

The KV cache's layout follows from the platform and vLLM's choices: on a CPU, vLLM's CPU_ATTN picks an ISA per
dtype, block size, head size and host (`_get_attn_isa`, imported rather than copied, so the answer is vLLM's own).
`VLLM_LOOKAHEAD_BACKEND=chain` forces the chain backend (tests; a user who wants vLLM's own attention only).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from vllm_lookahead.backends import CacheSpec, TreeBackend, select

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger("vllm_lookahead")

BACKEND_ENV = "VLLM_LOOKAHEAD_BACKEND"
BACKEND_CHOICES = ("auto", "chain")


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
    platform = getattr(current_platform, "device_type", "") or "unknown"
    return CacheSpec(platform, "unknown", dtype, kv_dtype, head_size, block_size)


def choose_backend(vllm_config: VllmConfig) -> TreeBackend:
    """The engine's backend; logs which path lookahead takes and why (once per process)."""
    wanted = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if wanted not in BACKEND_CHOICES:
        raise ValueError(f"vllm-lookahead: {BACKEND_ENV}={wanted!r}; expected one of {', '.join(BACKEND_CHOICES)}")
    forced = f"{BACKEND_ENV}=chain" if wanted == "chain" else None
    backend, why = select(cache_spec(vllm_config), force_chains=forced)
    logger.info("lookahead runs %s", why)
    return backend
