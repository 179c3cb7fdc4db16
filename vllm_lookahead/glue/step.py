"""One engine step's lookahead trees, carried from drafting to the forward pass to verification.

Life of a step (engine.py drives it; every vLLM hook calls one engine method):
1. `propose` (end of step k-1) builds each lookahead request's tree and opens a `LookaheadStep` holding them;
   the trees' nodes after the root are the requests' drafts.
2. `_prepare_inputs` (step k): `schedule` matches vLLM's scheduled drafts to those trees (the scheduler may cut a
   tree to a prefix of its nodes), and records each tree's rows, positions and block table: `ScheduledTree`.
3. `_model_forward`: the step is handed to the attention path for the duration of the forward pass only
   (`forward_scope`), which reads `attention_rows` (and keeps its per-step attention plans here).
4. `_sample`: the step's sampling (`StepResult`) feeds verification: the trees are verified, the KV and the
   per-request state updated, and the step is closed.
A step lives for one engine step; nothing of it is matched again later.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_lookahead.backends.base import TreeBackend, TreeRows
from vllm_lookahead.core.tree import StepTree

if TYPE_CHECKING:
    import torch
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata


@dataclass(frozen=True)
class ScheduledTree:
    """A request's tree as vLLM scheduled it this step."""

    req_id: str
    req_index: int  # row in the input batch
    q_start: int  # its first query row (x0) in the flattened batch
    prefix_len: int  # tokens cached before x0; x0 sits at position prefix_len
    tree: StepTree  # cut to the scheduled drafts (or a chain of drafts this engine did not make)
    ours: bool  # this engine drafted it (False: vLLM's own padding drafts, verified as a chain)


@dataclass
class LookaheadStep:
    proposed: dict[str, StepTree]  # request id -> its tree; vLLM was handed a prefix of its nodes as drafts
    backend: TreeBackend  # computes the tree rows' attention (the engine's, for every step)
    scheduled: list[ScheduledTree] = field(default_factory=list)
    attention_rows: list[TreeRows] = field(default_factory=list)  # the scheduled trees that are not chains
    attention_plans: dict[int, object] = field(default_factory=dict)  # the backend's, per attention metadata


@dataclass(frozen=True)
class StepResult:
    """A step's sampling, as verification reads it (`sampling.sample`)."""

    logits: torch.Tensor  # the step's logits rows: each request's drafts plus one bonus row
    spec_md: SpecDecodeMetadata | None  # None: a step without a single draft, sampled as vLLM samples without any
    sampler_output: SamplerOutput  # [requests x (max drafts + 1)] tokens, written over by verification
    first_rows: list[int]  # each request's first logits row (its x0's)
    # Column 0 of the output is vLLM's sampler's draw at each x0 row (False: vLLM's rejection sampler ran)...
    first_rows_sampled: bool
    # ... or, where every draw is its row's argmax (`sampling.argmax_is_the_draw`), still to be written: verification
    # takes the argmax of every row anyway.
    x0_is_argmax: bool


_current: LookaheadStep | None = None


@contextmanager
def forward_scope(step: LookaheadStep | None) -> Iterator[None]:
    """Make `step` the one the attention path reads while the forward pass runs (a worker runs one at a time)."""
    global _current
    _current = step
    try:
        yield
    finally:
        _current = None


def current() -> LookaheadStep | None:
    """The step of the forward pass under way, or None (plain runs, warm-up, profiling passes)."""
    return _current
