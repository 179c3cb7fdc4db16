"""Drafts ride with the step's model output: no second call to the worker per step.

vLLM 0.32 fetches a step's drafts from the worker after the step (`EngineCore.post_step` ->
`take_draft_token_ids`), one more round trip to the worker process per step besides the step's own, which costs
about what the plugin's own per-step work does. A lookahead runner attaches its drafts to the `ModelRunnerOutput`
its `sample_tokens` returns (pickled to the engine core with it); the scheduler, reading that output, keeps them in
its lookahead state (`scheduler.SchedulerState`) for the step's `post_step`, which hands them to the scheduler
without the round trip. Engines without lookahead, and outputs without drafts attached (vLLM's shared empty
output), take vLLM's own path.
"""

from __future__ import annotations

from vllm_lookahead.glue.patches.base import Patch
from vllm_lookahead.glue.patches.model_runner import engine_of
from vllm_lookahead.glue.patches.scheduler import state_of

ATTR = "lookahead_drafts"  # on a ModelRunnerOutput: the runner's DraftTokenIds (or None: no drafts this step)
_NONE = object()


def _runner():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


def _sample_tokens(original):
    def sample_tokens(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if engine_of(self) is None:
            return out
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

        if type(out) is ModelRunnerOutput and out is not EMPTY_MODEL_RUNNER_OUTPUT:  # never the shared constant
            setattr(out, ATTR, self.take_draft_token_ids())
        return out

    return sample_tokens


def _scheduler():
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


def _update_from_output(original):
    def update_from_output(self, scheduler_output, model_runner_output):
        drafts = getattr(model_runner_output, ATTR, _NONE)
        state = state_of(self)
        if drafts is not _NONE and state is not None:
            state.drafts, state.has_drafts = drafts, True
        return original(self, scheduler_output, model_runner_output)

    return update_from_output


def _engine_core():
    from vllm.v1.engine.core import EngineCore

    return EngineCore


def _post_step(original):
    def post_step(self, model_executed: bool) -> None:
        state = state_of(self.scheduler)
        if state is None or not state.has_drafts:
            return original(self, model_executed)
        drafts, state.drafts, state.has_drafts = state.drafts, None, False
        if self.check_for_draft_tokens and not self.async_scheduling and model_executed and drafts is not None:
            self.scheduler.update_draft_token_ids(drafts)
        # The rest of vLLM's post_step (queued client requests), without its fetch of the drafts.
        check, self.check_for_draft_tokens = self.check_for_draft_tokens, False
        try:
            return original(self, model_executed)
        finally:
            self.check_for_draft_tokens = check

    return post_step


PATCHES = [
    Patch("runner.sample_tokens", _runner, "sample_tokens", _sample_tokens),
    Patch("scheduler.update_from_output", _scheduler, "update_from_output", _update_from_output),
    Patch("engine_core.post_step", _engine_core, "post_step", _post_step),
]
