"""Model runner: drive lookahead from vLLM's own step (GPUModelRunner, which CPUModelRunner inherits).

- `__init__`: a lookahead config builds the runner as for a `custom_class` drafter (our LookaheadDrafter, so
  vLLM keeps its own rejection sampler and list-based draft flow) and attaches a LookaheadEngine.
- `_update_states`: per-request state is dropped when a request finishes or is preempted, and rebuilt on
  its next decode step.
- `_prepare_inputs`: after vLLM computed positions and slot mapping, tree tokens get positions pos(x0)+depth.
- `_sample`: tree verification replaces the linear-chain result for lookahead requests; KV is relocated.
- `propose_draft_token_ids`: the next trees become the drafts.
Every wrapper is a pass-through when the runner has no LookaheadEngine.
"""

from __future__ import annotations

from patches import Patch
from patches.speculative_config import METHOD, lookahead_params

DRAFTER_CLASS = "vllm_lookahead.drafter.LookaheadDrafter"


def _owner():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


def _init(original):
    def __init__(self, vllm_config, *args, **kwargs):
        sc = vllm_config.speculative_config
        if sc is None or sc.method != METHOD:
            return original(self, vllm_config, *args, **kwargs)
        from vllm_lookahead.engine import LookaheadEngine

        # The runner knows no "lookahead" method: let it build a custom-class drafter, then say lookahead again.
        sc.method, sc.model = "custom_class", DRAFTER_CLASS
        try:
            original(self, vllm_config, *args, **kwargs)
        finally:
            sc.method, sc.model = METHOD, METHOD
        self._lookahead = LookaheadEngine(
            lookahead_params(sc), sc.num_speculative_tokens, vllm_config.model_config.max_model_len
        )

    return __init__


def _update_states(original):
    def _update_states(self, scheduler_output):
        engine = getattr(self, "_lookahead", None)
        if engine is not None:
            for req_id in scheduler_output.finished_req_ids:
                engine.drop(req_id)
            for req_id in scheduler_output.preempted_req_ids or ():
                engine.drop(req_id)
                engine.stats.preemptions += 1
            for req_id in scheduler_output.scheduled_cached_reqs.resumed_req_ids:
                engine.drop(req_id)
        return original(self, scheduler_output)

    return _update_states


def _prepare_inputs(original):
    def _prepare_inputs(self, scheduler_output, *args, **kwargs):
        result = original(self, scheduler_output, *args, **kwargs)
        engine = getattr(self, "_lookahead", None)
        if engine is not None:
            from vllm_lookahead import step_context

            engine.begin_step(self, scheduler_output)
            step_context.active = engine
        return result

    return _prepare_inputs


def _sample(original):
    def _sample(self, logits, spec_decode_metadata):
        sampler_output = original(self, logits, spec_decode_metadata)
        engine = getattr(self, "_lookahead", None)
        if engine is not None:
            from vllm_lookahead import step_context

            step_context.active = None
            engine.finish_step(self, logits, spec_decode_metadata, sampler_output)
        return sampler_output

    return _sample


def _propose(original):
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        engine = getattr(self, "_lookahead", None)
        if engine is None:
            return original(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        return engine.propose(self, sampled_token_ids)

    return propose_draft_token_ids


def _worker_owner():
    from vllm.v1.worker.worker_base import WorkerBase

    return WorkerBase


def _worker_stats(_missing):
    # `LLM.collective_rpc("lookahead_stats")` reads the counters without pickling a function.
    def lookahead_stats(self):
        from vllm_lookahead.engine import worker_stats

        return worker_stats(self)

    return lookahead_stats


PATCHES = [
    Patch("worker.lookahead_stats (added)", _worker_owner, "lookahead_stats", _worker_stats),
    Patch("runner.__init__", _owner, "__init__", _init),
    Patch("runner._update_states", _owner, "_update_states", _update_states),
    Patch("runner._prepare_inputs", _owner, "_prepare_inputs", _prepare_inputs),
    Patch("runner._sample", _owner, "_sample", _sample),
    Patch("runner.propose_draft_token_ids", _owner, "propose_draft_token_ids", _propose),
]
