"""Scheduler: no placeholder drafts for new requests, and no drafts in a step that admits a prompt.

vLLM 0.32 pads a new request that needs one token (its prompt prefix-cached, e.g. every `n>1` sibling after the
first, or a resumed request) to 1 + num_speculative_tokens tokens of which the drafts are -1 placeholders, so that
GPU steps keep one CUDA-graph shape. For lookahead num_speculative_tokens is the largest tree (tens of nodes), so
each such request would compute tens of junk tokens in its first step. vLLM skips that padding when its per-batch
draft-length table (`dynamic_sd_lookup`) is set; lookahead sets it to num_speculative_tokens at every batch size,
which changes nothing else (the table only gives the step's draft length, the same value as without it).

A step that admits a waiting request computes its prompt together with the running requests' tokens, and the new
request's user waits for that whole step before the first token; the running requests' drafts would lengthen it
(on a CPU a step costs about its token count). So such a step schedules the running requests without drafts, once
per waiting request at the head of the queue (one that stays waiting, for want of KV blocks, does not keep the
running requests from drafting), and only while the waiting requests are at least 1 / ADMISSION_SHARE of the
running ones: into a large batch new requests trickle in at nearly every step, and dropping their drafts would cost
more tokens a second than the few waiting users gain. ADMISSION_SHARE's measurement: docs/results.md, "Tuned
constants".

What lookahead keeps on the scheduler is one object, `SchedulerState`, in one attribute (`_lookahead`; None for
other methods).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_lookahead.glue.patches.base import Patch
from vllm_lookahead.glue.patches.speculative_config import METHOD

ADMISSION_SHARE = 4
ATTR = "_lookahead"  # the scheduler's SchedulerState


@dataclass
class SchedulerState:
    admitting: str | None = None  # the waiting request the last step dropped drafts for
    # The runner's drafts that came with the step's model output, from update_from_output to post_step
    # (`draft_transfer.py`); `has_drafts` tells None (no drafts this step) from nothing kept.
    drafts: Any = None
    has_drafts: bool = False


def state_of(scheduler: Any) -> SchedulerState | None:
    """A lookahead scheduler's state; None for other methods."""
    return getattr(scheduler, ATTR, None)


def _owner():
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


def _init(original):
    def __init__(self, vllm_config, *args, **kwargs):
        original(self, vllm_config, *args, **kwargs)
        sc = vllm_config.speculative_config
        lookahead = sc is not None and sc.method == METHOD
        setattr(self, ATTR, SchedulerState() if lookahead else None)
        if lookahead and self.dynamic_sd_lookup is None:
            self.dynamic_sd_lookup = [self.num_spec_tokens] * (self.scheduler_config.max_num_seqs + 1)

    return __init__


def _schedule(original):
    def schedule(self, *args, **kwargs):
        state = state_of(self)
        if state is not None:
            _drop_drafts_for_admission(self, state)
        return original(self, *args, **kwargs)

    return schedule


def _drop_drafts_for_admission(scheduler: Any, state: SchedulerState) -> None:
    """Running requests keep no drafts in a step that will admit the request at the head of the waiting queue."""
    from vllm.v1.core.sched.interface import PauseState

    waiting = scheduler.waiting
    active = len(scheduler.running) + scheduler.num_waiting_for_streaming_input  # as vLLM counts for admission
    if not waiting or active >= scheduler.max_num_active_reqs or scheduler._pause_state != PauseState.UNPAUSED:
        state.admitting = None
        return
    if len(waiting) * ADMISSION_SHARE < len(scheduler.running):
        state.admitting = None
        return  # a trickle into a large batch: its drafts are worth more than the few waiting users' wait
    head = waiting.peek_request().request_id
    if head == state.admitting:
        return  # still waiting after a step without drafts: something else holds it back
    state.admitting = head
    for request in scheduler.running:
        request.spec_token_ids = []  # a new list: the old one may be the runner's own output


PATCHES = [
    Patch("scheduler.__init__", _owner, "__init__", _init),
    Patch("scheduler.schedule", _owner, "schedule", _schedule),
]
