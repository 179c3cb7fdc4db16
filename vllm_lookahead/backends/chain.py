"""The chain backend: lookahead wherever no tree backend reads the KV cache.

Each request carries only its best branch, which sits at consecutive positions and slots like ngram's or suffix's
drafts: vLLM's own attention computes it as it is, and accepted tokens are already where vLLM expects them. So this
backend is never asked to attend or to move anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_lookahead.backends.base import CacheSpec, TreeBackend


class ChainBackend(TreeBackend):
    name = "chain"
    trees = False

    @classmethod
    def unsupported(cls, spec: CacheSpec) -> str | None:
        return None  # runs wherever vLLM's own speculative decoding runs

    def attend(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("vllm-lookahead: the chain backend was handed tree rows")

    def relocate(self, layers: Sequence[Any], src: Sequence[int], dst: Sequence[int]) -> None:
        if src:
            raise RuntimeError("vllm-lookahead: the chain backend was asked to move KV (chains need no moves)")
