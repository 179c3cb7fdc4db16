"""Request lifetime: which requests lookahead serves, and each one's state from its second step until it
finishes, is preempted or resumes (a resumed request rebuilds its state on its next step)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_lookahead.core.acceptance import AcceptanceStats
from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.core.pool import NGramPool
from vllm_lookahead.core.recycle import TokenRecycler
from vllm_lookahead.core.state import LookaheadState
from vllm_lookahead.core.suffix import SuffixCandidates
from vllm_lookahead.glue.eligibility import ineligible_reason, request_params
from vllm_lookahead.glue.resting import Rests
from vllm_lookahead.glue.stats import LookaheadStats
from vllm_lookahead.glue.target_dist import GREEDY_EPS

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

logger = logging.getLogger("vllm_lookahead")


@dataclass
class Shared:
    """What every request's state shares: the acceptance statistics (greedy and sampled requests accept at different
    rates, so each kind learns its own), the suffix trees (with earlier requests' outputs), the token recycler and the
    n-gram pool shared by all requests."""

    acceptance: AcceptanceStats
    acceptance_sampled: AcceptanceStats
    suffix: SuffixCandidates | None
    recycle: TokenRecycler | None
    shared_pool: NGramPool | None


class Requests:
    def __init__(
        self, params: LookaheadParams, shared: Shared, stats: LookaheadStats, rests: Rests | None = None
    ) -> None:
        self.params = params
        self.shared = shared
        self.stats = stats
        self.states: dict[str, LookaheadState] = {}
        self.rests = rests or Rests()  # requests whose last trees carried no draft, and their rests
        self._eligible: dict[str, bool] = {}
        self._said: set[str] = set()

    def drop_finished(self, runner: GPUModelRunner, scheduler_output: SchedulerOutput) -> None:
        """Forget finished, preempted and resumed requests. A finished request's state first learns the tokens it
        missed while resting (`resting.py`), so that its whole output stays a suffix candidate."""
        batch = runner.input_batch
        for req_id in scheduler_output.finished_req_ids:
            state, index = self.states.get(req_id), batch.req_id_to_index.get(req_id)
            if state is not None and index is not None and req_id in self.rests:
                _catch_up(state, batch, index)
            self._drop(req_id)
        for req_id in scheduler_output.preempted_req_ids or ():
            self._drop(req_id)
            self.stats.preemptions += 1
        for req_id in scheduler_output.scheduled_cached_reqs.resumed_req_ids:
            self._drop(req_id)

    def _drop(self, req_id: str) -> None:
        state = self.states.pop(req_id, None)
        if state is not None:
            state.close()
        self._eligible.pop(req_id, None)
        self.rests.forget(req_id)

    def eligible(self, runner: GPUModelRunner, req_id: str) -> bool:
        """Whether lookahead drafts for this request (decided once; each reason for plain decoding logged once)."""
        ok = self._eligible.get(req_id)
        if ok is None:
            req_state = runner.requests.get(req_id)
            if req_state is None:
                return False
            reason = ineligible_reason(
                req_state.sampling_params, logprobs_mode=runner.sampler.logprobs_mode, server=self.params
            )
            ok = self._eligible[req_id] = reason is None
            if not ok:
                self.stats.fallback_requests += 1
                if reason not in self._said:
                    self._said.add(reason)
                    logger.warning("lookahead: plain decoding for requests where %s", reason)
        return ok

    def state(self, runner: GPUModelRunner, index: int, req_id: str) -> LookaheadState:
        """The request's state (built at its first step that drafts), caught up with its tokens so far."""
        batch = runner.input_batch
        state = self.states.get(req_id)
        if state is None:
            prompt = batch.token_ids_cpu[index, : int(batch.num_prompt_tokens[index])].tolist()
            sp = runner.requests[req_id].sampling_params
            sampled = sp.temperature >= GREEDY_EPS
            s = self.shared
            state = self.states[req_id] = LookaheadState(
                request_params(self.params, sp) or self.params,  # its own settings (checked when eligible)
                prompt,
                stats=s.acceptance_sampled if sampled else s.acceptance,
                suffix=s.suffix,
                req_id=req_id,
                shared=s.shared_pool,
                recycle=s.recycle,
            )
        _catch_up(state, batch, index)
        return state

    @staticmethod
    def plain_greedy(runner: GPUModelRunner, req_id: str) -> bool:
        """A greedy request lookahead may verify as a chain (opted-out ones too): drafts this engine did not make."""
        req_state = runner.requests.get(req_id)
        if req_state is None or req_state.sampling_params is None:
            return False
        sp = req_state.sampling_params
        reason = ineligible_reason(sp, honour_opt_out=False, logprobs_mode=runner.sampler.logprobs_mode)
        return sp.temperature < GREEDY_EPS and reason is None


def _catch_up(state: LookaheadState, batch: InputBatch, index: int) -> None:
    """The state learns the request's tokens so far (those of the input batch's row `index`)."""
    state.catch_up(int(batch.num_tokens_no_spec[index]), lambda a, b: batch.token_ids_cpu[index, a:b].tolist())
