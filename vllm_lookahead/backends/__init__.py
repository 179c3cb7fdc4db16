"""Attention backends behind one interface (`base.TreeBackend`): which one runs a model's tree rows.

`select` tries the tree backends written for the platform in order and takes the first that reads the model's KV
cache; where none does, the chain backend (each request's best branch, through vLLM's own attention). Backends are
imported only when asked for, so a platform's code (vLLM's CPU ops, Triton) is loaded only on that platform.
"""

from __future__ import annotations

import importlib

from vllm_lookahead.backends.base import CacheSpec, TreeBackend, TreeRows
from vllm_lookahead.backends.chain import ChainBackend

__all__ = ["CHAINS", "CacheSpec", "ChainBackend", "TreeBackend", "TreeRows", "select", "TREE_BACKENDS"]

# Per platform, the tree backends in the order they are tried ("module:Class", imported lazily).
TREE_BACKENDS: dict[str, tuple[str, ...]] = {
    "cpu": ("vllm_lookahead.backends.cpu.backend:CpuTreeBackend",),
    "cuda": ("vllm_lookahead.backends.cuda.backend:CudaTreeBackend",),
}
CHAINS = "chains (each request's best branch, vLLM's own attention)"


def _load(path: str) -> type[TreeBackend]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def select(spec: CacheSpec, force_chains: str | None = None, compiled: bool = True) -> tuple[TreeBackend, str]:
    """The backend for a KV cache and a sentence saying which path lookahead takes and why.
    force_chains: a reason to run chains whatever the cache (settings the tree path does not serve); compiled: whether
    backends may run the platform's compiled library (False: their plain torch and numpy paths)."""
    if force_chains:
        return _chains(spec, compiled), f"{CHAINS}: {force_chains}"
    reasons = []
    for path in TREE_BACKENDS.get(spec.platform, ()):
        cls = _load(path)
        why = cls.unsupported(spec)
        if why is None:
            return cls.create(compiled), f"trees through the {cls.name} attention backend ({spec})"
        reasons.append(why)
    if not reasons:
        reasons.append(f"no tree attention backend for the {spec.platform} platform")
    why = "; ".join(reasons)
    return _chains(spec, compiled), f"{CHAINS}: {why}"


def _chains(spec: CacheSpec, compiled: bool) -> ChainBackend:
    """The chain backend; on a CPU it reads logits rows with the compiled library, as the CPU backend does, and on a
    GPU on the device, as the CUDA backend does."""
    if spec.platform == "cuda":
        from vllm_lookahead.backends.logit_rows import DeviceLogitRows

        return ChainBackend(DeviceLogitRows())
    if spec.platform != "cpu":
        return ChainBackend()
    from vllm_lookahead.backends.cpu.logit_rows import cpu_rows

    return ChainBackend(cpu_rows(compiled))
