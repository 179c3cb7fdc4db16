"""Scheduler: no padding of new requests with placeholder drafts.

vLLM 0.32 pads a new request that needs one token (its prompt prefix-cached, e.g. every `n>1` sibling after the
first, or a resumed request) to 1 + num_speculative_tokens tokens of which the drafts are -1 placeholders, so that
GPU steps keep one CUDA-graph shape. For lookahead num_speculative_tokens is the largest tree (tens of nodes), so
each such request would compute tens of junk tokens in its first step. vLLM skips that padding when its per-batch
draft-length table (`dynamic_sd_lookup`) is set; lookahead sets it to num_speculative_tokens at every batch size,
which changes nothing else (the table only gives the step's draft length, the same value as without it).
"""

from __future__ import annotations

from vllm_lookahead.glue.patches.base import Patch
from vllm_lookahead.glue.patches.speculative_config import METHOD


def _owner():
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


def _init(original):
    def __init__(self, vllm_config, *args, **kwargs):
        original(self, vllm_config, *args, **kwargs)
        sc = vllm_config.speculative_config
        if sc is not None and sc.method == METHOD and self.dynamic_sd_lookup is None:
            self.dynamic_sd_lookup = [self.num_spec_tokens] * (self.scheduler_config.max_num_seqs + 1)

    return __init__


PATCHES = [Patch("scheduler.__init__", _owner, "__init__", _init)]
