"""Shared fixtures. Engine tests start the real vLLM CPU engine on the embedded default model."""

from __future__ import annotations

import gc
import os
import sys

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def model_path() -> str:
    from vllm_lookahead.devtools.models import default_model_path

    return default_model_path()


def make_llm(model_path: str, *, alone: bool = False, **kwargs):
    """A small, deterministic engine: float32 (exactness is only defined there), eager, short context.

    Its engine core runs in this process (its worker in vLLM's own worker process, so that engines alive at once
    keep apart): spawning and importing vLLM for an engine-core process as well took about 8 s an engine. The served
    and benchmark tests run vLLM's default layout, as users do.

    `alone=True` (an engine no other engine in this process outlives or overlaps) runs the worker in this process
    too, about 15 s an engine less; vLLM's in-process worker tears down the process-wide distributed groups when it
    is freed, which an engine still alive beside it would lose."""
    from vllm import LLM, envs

    args = dict(model=model_path, dtype="float32", max_model_len=1024, seed=0, enforce_eager=True)
    args.update(kwargs)
    # vLLM's in-process worker start scans every loaded module for Triton kernels and fails on llvmlite's library
    # proxy ("'_lib_fn_wrapper' object has no attribute 'get'") once numba is loaded here (vLLM's ngram drafter in
    # an earlier test's in-process worker imports it): from then on every worker runs in a process of its own.
    alone = alone and "llvmlite.binding.ffi" not in sys.modules
    args.setdefault("distributed_executor_backend", "uni" if alone else "mp")
    key = "VLLM_ENABLE_V1_MULTIPROCESSING"
    before = os.environ.get(key)
    os.environ[key] = "0"
    try:
        return LLM(**args)
    finally:
        if before is None:
            del os.environ[key]
        else:
            os.environ[key] = before
        # The engine core caches vLLM's variables once started (later tests set theirs) and freezes the heap for a
        # server's GC pauses (an older engine freed later must stay collectable here).
        envs.disable_envs_cache()
        gc.unfreeze()
