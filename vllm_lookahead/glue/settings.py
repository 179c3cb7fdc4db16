"""Switches outside `speculative_config`, read from the environment once, when an engine starts (`from_env`), and
handed to the parts they change. Benchmarks and tests use them to compare a path with another; none changes what
a request outputs.

- `VLLM_LOOKAHEAD_BACKEND=chain`: the chain backend whatever the KV cache (each request's best branch through
  vLLM's own attention); `auto` (the default) lets the cache decide (`platform.choose_backend`).
- `VLLM_LOOKAHEAD_TREE_KERNEL=0`: the compiled CPU library unused (tree rows, KV moves and logits rows on plain
  torch and numpy).
- `VLLM_LOOKAHEAD_REST=N`: an idle request rests at most N steps (`resting.py`; 0: every request builds its tree
  every step).
- `VLLM_LOOKAHEAD_FIX_CPU_SAMPLING=1`: vLLM's CPU sampling fix for every speculative method, not only while
  lookahead samples (`patches/cpu_sampling.py`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_lookahead.glue.resting import MAX_REST

BACKEND_ENV = "VLLM_LOOKAHEAD_BACKEND"
BACKEND_CHOICES = ("auto", "chain")


@dataclass(frozen=True)
class Settings:
    backend: str = "auto"  # one of BACKEND_CHOICES (checked where a lookahead engine starts)
    compiled: bool = True  # the compiled CPU library may run
    max_rest: int = MAX_REST  # the longest rest of an idle request, in steps
    fix_cpu_sampling: bool = False  # the CPU sampling fix for every method

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        return cls(
            backend=env.get(BACKEND_ENV, "auto").strip().lower() or "auto",
            compiled=env.get("VLLM_LOOKAHEAD_TREE_KERNEL", "1") != "0",
            max_rest=max(0, int(env.get("VLLM_LOOKAHEAD_REST", MAX_REST))),
            fix_cpu_sampling=env.get("VLLM_LOOKAHEAD_FIX_CPU_SAMPLING") == "1",
        )
