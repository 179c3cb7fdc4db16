"""Scheduler: no placeholder drafts for new requests, and no drafts in a step that admits a prompt.

vLLM 0.32 pads a new request that needs one token (its prompt prefix-cached, e.g. every `n>1` sibling after the
first, or a resumed request) to 1 + num_speculative_tokens tokens of which the drafts are -1 placeholders, so that
GPU steps keep one CUDA-graph shape. For lookahead num_speculative_tokens is the largest tree (tens of nodes), so
each such request would compute tens of junk tokens in its first step. vLLM skips that padding when its per-batch
draft-length table (`dynamic_sd_lookup`) is set; lookahead sets it to num_speculative_tokens at every batch size,
which changes nothing else (the table only gives the step's draft length, the same value as without it).

A step that admits a waiting request computes its prompt together with the running requests' tokens, and the new
request's user waits for that whole step before the first token. The running requests' drafts would lengthen it:
on a CPU a step costs about its token count, so three running code requests' trees (tens of nodes) add a fifth or
more to a 150-token prompt's step. Such a step schedules the running requests without drafts (their trees were
sized for a decoding step, not one that a user waits on). The drafts are dropped only once per waiting request at
the head of the queue: one that stays waiting (no free KV blocks) does not keep the running requests from drafting.
Measured on code prompts at 4 and 16 concurrent requests (bfloat16, `vllm bench serve`): time to first token went
from 1.14x and 1.09x plain decoding's to 0.99x and 1.03x, tokens/s unchanged (such a step is long, so its drafts
bring about what they cost).

That holds while the waiting users are a fair share of those served (a first wave of prompts, a small batch). Into a
large batch new requests trickle at nearly every step (64 requests of 128 tokens finish about three a step), so the
rule dropped the drafts of nearly every step: 2-8% fewer tokens/s at 16 and 64 requests, for a time to first token
already well under plain decoding's there. Drafts are dropped only while the waiting requests number at least a
quarter of the running ones (ADMISSION_SHARE).
"""

from __future__ import annotations

from vllm_lookahead.glue.patches.base import Patch
from vllm_lookahead.glue.patches.speculative_config import METHOD

# Drafts are dropped for an admission while the waiting requests are at least 1 / ADMISSION_SHARE of the running ones.
ADMISSION_SHARE = 4


def _owner():
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


def _init(original):
    def __init__(self, vllm_config, *args, **kwargs):
        original(self, vllm_config, *args, **kwargs)
        sc = vllm_config.speculative_config
        self._lookahead = sc is not None and sc.method == METHOD
        self._lookahead_admitting: str | None = None  # the waiting request the last step dropped drafts for
        if self._lookahead and self.dynamic_sd_lookup is None:
            self.dynamic_sd_lookup = [self.num_spec_tokens] * (self.scheduler_config.max_num_seqs + 1)

    return __init__


def _schedule(original):
    def schedule(self, *args, **kwargs):
        if getattr(self, "_lookahead", False):
            _drop_drafts_for_admission(self)
        return original(self, *args, **kwargs)

    return schedule


def _drop_drafts_for_admission(scheduler) -> None:
    """Running requests keep no drafts in a step that will admit the request at the head of the waiting queue."""
    from vllm.v1.core.sched.interface import PauseState

    waiting = scheduler.waiting
    active = len(scheduler.running) + scheduler.num_waiting_for_streaming_input  # as vLLM counts for admission
    if not waiting or active >= scheduler.max_num_active_reqs or scheduler._pause_state != PauseState.UNPAUSED:
        scheduler._lookahead_admitting = None
        return
    if len(waiting) * ADMISSION_SHARE < len(scheduler.running):
        scheduler._lookahead_admitting = None
        return  # a trickle into a large batch: its drafts are worth more than the few waiting users' wait
    head = waiting.peek_request().request_id
    if head == scheduler._lookahead_admitting:
        return  # still waiting after a step without drafts: something else holds it back
    scheduler._lookahead_admitting = head
    for request in scheduler.running:
        request.spec_token_ids = []  # a new list: the old one may be the runner's own output


PATCHES = [
    Patch("scheduler.__init__", _owner, "__init__", _init),
    Patch("scheduler.schedule", _owner, "schedule", _schedule),
]
