"""The one interface every attention backend implements, and what the glue hands it.

A backend answers these for the engine:
- `unsupported(spec)`: whether it runs lookahead's tree rows on a given KV cache (its platform, layout, dtype,
  head size, block size); None when it does, else why not (the engine then runs the chain backend and says so once);
  `check_layers(layers)` confirms it on the model's real attention layers once they exist;
- `prepare(rows, plans)`: once a step that carries trees is scheduled, before its forward pass: what every layer's
  `attend` reads (a GPU's kernel descriptors, uploaded once), kept in the step's `plans`;
- `attend(rows, plans, ...)`: one attention layer of a step that carries trees: every row of the batch computed, the
  tree rows with each node attending its request's cached prefix and its own ancestors;
- `relocate(layers, src, dst)`: accepted tree nodes' KV moved from the slots they were written at to the
  consecutive slots vLLM expects, in every layer's cache;
- `warm_up(layers)`: before the first request, whatever the backend would otherwise prepare while requests wait (a
  GPU's Triton kernels compiled);
- `logit_rows`: the target's argmax and top tokens over chosen rows of a step's logits, which verification and token
  recycling read (`logit_rows.LogitRows`: torch's; a CPU's compiled library where it loads, `cpu.logit_rows`; on a
  GPU `logit_rows.DeviceLogitRows`, which also tells verification to draw sampled trees' tokens on the device).
The CPU layouts (`backends.cpu`), the chain fallback (`backends.chain`) and the GPU kernel (`backends.cuda`) are the
implementations. Backends import no glue: the glue hands them the step's tree rows (`TreeRows`) and a per-step dict
in which a backend may keep what it prepares at the step's first layer for the others (`plans`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from vllm_lookahead.backends.logit_rows import LogitRows


@dataclass(frozen=True)
class TreeRows:
    """One lookahead request's tree rows in this step's flattened batch."""

    req_index: int  # its row in the step's query_start_loc / seq_lens / block table
    q_start: int  # first query row (the root x0)
    num_nodes: int  # tree nodes scheduled (root included): rows q_start .. q_start + num_nodes - 1
    seq_len: int  # cached prefix + num_nodes: every KV entry the request has once this step's KV is written
    block_ids: torch.Tensor  # the request's block table row (>= ceil(seq_len / block_size) entries)
    mask: torch.Tensor  # [num_nodes, num_nodes] bool, mask[u, v]: node u attends node v (StepTree.ancestor_mask)


@dataclass(frozen=True)
class CacheSpec:
    """What decides whether a backend reads and writes a model's KV cache."""

    platform: str  # "cpu", "cuda", ...
    layout: str  # CPU: vLLM's attention ISA ("vec", "vec16", "amx", "neon", ...); CUDA: the attention backend's name
    dtype: torch.dtype  # the model's (and the cache's, unless kv_cache_dtype says otherwise)
    kv_cache_dtype: str  # vLLM's cache_dtype: "auto" or a quantized one ("fp8", ...)
    head_size: int
    block_size: int

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return (
            f"{self.platform} {self.layout} layout, {dtype}, KV cache {self.kv_cache_dtype}, "
            f"head size {self.head_size}, block size {self.block_size}"
        )


class TreeBackend(ABC):
    name: ClassVar[str]
    trees: ClassVar[bool] = True  # False: the chain backend (each request's best branch, vLLM's own attention)

    def __init__(self, logit_rows: LogitRows | None = None) -> None:
        self.logit_rows = logit_rows or LogitRows()

    @classmethod
    def create(cls, compiled: bool = True) -> TreeBackend:
        """The engine's instance. compiled: whether it may run the platform's compiled library (False: its plain
        torch and numpy paths)."""
        return cls()

    @classmethod
    @abstractmethod
    def unsupported(cls, spec: CacheSpec) -> str | None:
        """None where this backend runs tree rows on such a cache, else the reason it does not."""

    def prepare(self, rows: Sequence[TreeRows], plans: dict[int, object]) -> None:
        """Once a step with tree rows is scheduled, before its forward pass: what `attend` reads at every layer, into
        `plans` (the default: nothing; a backend may then prepare at the step's first layer)."""
        return None

    @abstractmethod
    def attend(
        self,
        rows: Sequence[TreeRows],
        plans: dict[int, object],
        original: Callable[..., torch.Tensor],
        impl: Any,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: Any,
        output: torch.Tensor,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """One layer's forward for a step with tree rows (`rows`; `plans`: the step's dict for what the backend
        prepares at its first layer). `original` is vLLM's forward of this layer; the arguments after it are vLLM's,
        as it passed them."""

    @abstractmethod
    def relocate(self, layers: Sequence[Any], src: Sequence[int], dst: Sequence[int]) -> None:
        """For every attention layer's cache, copy the KV at global slots `src` to slots `dst` (pairwise; every
        source read before any destination is written)."""

    def warm_up(self, layers: Sequence[Any]) -> str | None:
        """After vLLM's own warm-up, before the first request (the layers `check_layers` accepted): what would
        otherwise be prepared on the first requests' time. Returns what it did, for the log (None: nothing)."""
        return None

    def check_layers(self, layers: Sequence[Any]) -> str | None:
        """Once the model's attention layers and caches exist (before the first step): None where this backend
        computes every layer's tree rows as vLLM's own kernel would, else why not (the engine then runs chains)."""
        return None

    def used_kernel(self, plans: dict[int, object]) -> bool:
        """Whether a step's tree rows went through the backend's fast kernel (for the engine's counters)."""
        return False
