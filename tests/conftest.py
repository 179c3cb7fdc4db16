"""Shared fixtures. Engine tests start the real vLLM CPU engine on the embedded default model."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def model_path() -> str:
    from vllm_lookahead.devtools.models import default_model_path

    return default_model_path()


def make_llm(model_path: str, **kwargs):
    """A small, deterministic engine: float32 (exactness is only defined there), eager, short context."""
    from vllm import LLM

    args = dict(model=model_path, dtype="float32", max_model_len=1024, seed=0, enforce_eager=True)
    args.update(kwargs)
    return LLM(**args)
