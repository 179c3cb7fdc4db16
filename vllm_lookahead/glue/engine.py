"""The vLLM glue: one LookaheadEngine per model runner runs lookahead for the requests of its batches.

Each vLLM hook (patches/model_runner.py) calls exactly one method here, in the runner's own order, and each method
hands the work to the module that does it:
- `drop_requests` (`_update_states`): per-request state goes when a request finishes, is preempted or resumes
  (`requests.py`);
- `begin_step` (after `_prepare_inputs`): the step opened by the last `propose` learns what vLLM scheduled; tree
  tokens get positions pos(x0) + depth (`scheduling.py`); the step before is timed for the cost fit (`drafting.py`);
- `forward_scope` (around `_model_forward`): the attention backend sees the step's tree rows while the forward pass
  runs (`step.py`);
- `sample` (`_sample`): vLLM's sampler at each request's x0 row (`sampling.py`: the step's `StepResult`), then
  verification along each tree, KV relocation and the state update (`verification.py`), and logprobs
  (`logprobs.py`);
- `propose` (vLLM's drafter call): each lookahead request's next tree, sized (`drafting.py`); its nodes after the
  root are the drafts.
Three writes into vLLM's data (positions, sampler output rows, KV slots) are the only ones; everything that replaces
vLLM code is in patches/.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from vllm_lookahead.backends import CHAINS, ChainBackend, TreeBackend
from vllm_lookahead.core.acceptance import AcceptanceStats
from vllm_lookahead.core.corpus import read_corpus
from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.core.pool import NGramPool
from vllm_lookahead.core.recycle import TokenRecycler
from vllm_lookahead.core.suffix import SuffixCandidates
from vllm_lookahead.core.tree import Source
from vllm_lookahead.glue import logprobs, sampling
from vllm_lookahead.glue.drafting import Drafting
from vllm_lookahead.glue.platform import attention_layers, check_model_layers, graph_modes
from vllm_lookahead.glue.recycling import RecyclingGate
from vllm_lookahead.glue.requests import Requests, Shared
from vllm_lookahead.glue.resting import Rests
from vllm_lookahead.glue.scheduling import schedule_trees
from vllm_lookahead.glue.seed_timing import BUDGET_SECONDS, describe, seed_sizes, time_forwards
from vllm_lookahead.glue.settings import Settings
from vllm_lookahead.glue.stats import LookaheadStats
from vllm_lookahead.glue.step import LookaheadStep, forward_scope
from vllm_lookahead.glue.verification import Verification

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_lookahead.glue.sampling import VllmSample

logger = logging.getLogger("vllm_lookahead")


class LookaheadEngine:
    def __init__(
        self,
        params: LookaheadParams,
        max_model_len: int,
        ranks: int = 1,
        tokenize: Callable[[str], list[int]] | None = None,
        backend: tuple[TreeBackend, str] | None = None,
        settings: Settings | None = None,
    ) -> None:
        """settings: the switches read at start-up (`settings.py`; their defaults where not given)."""
        self.params = params
        settings = settings or Settings()
        # Who computes the tree rows' attention and moves accepted KV (the chain backend: chains only), and why.
        self.backend, self.backend_reason = backend or (ChainBackend(), f"{CHAINS}: no backend was chosen")
        self._confirmed = False
        self.stats = LookaheadStats()
        # Shared by all requests: what nodes of each source turn out to be worth, the suffix trees (with earlier
        # requests' outputs), the recycled tokens, the shared pool.
        self.shared = Shared(
            acceptance=AcceptanceStats(),
            acceptance_sampled=AcceptanceStats(),
            suffix=SuffixCandidates.create(params.suffix_depth, params.suffix_cache_requests),
            recycle=TokenRecycler() if params.recycle_candidates else None,
            shared_pool=(
                NGramPool(params.ngram_size, params.guess_set_size, params.shared_pool_keys)
                if params.shared_pool_keys
                else None
            ),
        )
        if params.suffix_corpus:
            self._load_corpus(params.suffix_corpus, tokenize)
        # Under tensor parallelism no request rests: every rank must build the same trees whatever its own sizes.
        self.requests = Requests(params, self.shared, self.stats, Rests(settings.max_rest if ranks == 1 else 0))
        self.recycling = RecyclingGate(self.shared.recycle)
        self.drafting = Drafting(params, max_model_len, ranks, self.backend, self.recycling)
        self.verification = Verification(self.requests, self.recycling, self.stats)
        self.layers: list[Any] = []  # the model's attention layers with their caches, found by confirm_backend
        self.pending: LookaheadStep | None = None  # opened by propose, scheduled by begin_step
        self.step: LookaheadStep | None = None  # the step under way, closed by sample

    @property
    def acceptance(self) -> AcceptanceStats:
        return self.shared.acceptance

    @property
    def suffix(self) -> SuffixCandidates | None:
        return self.shared.suffix

    def _load_corpus(self, path: str, tokenize: Callable[[str], list[int]] | None) -> None:
        """The suffix corpus into the global suffix tree (`corpus.py`), tokenized by the served model's tokenizer."""
        suffix = self.shared.suffix
        if suffix is None or not self.params.suffix_candidates:  # the latter only where built without a server
            why = "no arctic_inference" if suffix is None else "suffix_candidates is 0"
            logger.warning("lookahead: suffix_corpus is not loaded: the suffix trees are off (%s)", why)
            return
        if tokenize is None:
            raise ValueError("lookahead: suffix_corpus needs the model's tokenizer, which this engine was not given")
        start = time.perf_counter()
        texts = read_corpus(path)
        if not texts:
            logger.warning("lookahead: suffix_corpus %s holds no text", path)
        # the tree keeps the last suffix_cache_requests outputs: the earlier texts would be evicted at once
        outputs = [tokenize(text) for text in texts[-self.params.suffix_cache_requests :]]
        suffix.seed(outputs)
        logger.info(
            "lookahead: suffix corpus %s: %d texts, %d tokens, %d held (suffix_cache_requests %d), in %.1f s",
            path, len(outputs), sum(map(len, outputs)), suffix.cached_requests(),
            self.params.suffix_cache_requests, time.perf_counter() - start,
        )  # fmt: skip

    # -- the hooks, in the runner's order ---------------------------------------------------------------------
    def confirm_backend(self, runner: GPUModelRunner) -> None:
        """Once the model's layers and their caches exist: the model's layers (`check_model_layers`: recurrent
        layers refused, what no backend's trees serve sends the engine to chains) and the backend's own check of the
        attention layers; which path lookahead takes and why, and on CUDA which graphs each kind of step runs under,
        go to the log once."""
        self.layers = attention_layers(runner)  # the same list every step after (backends key what they checked on it)
        why = check_model_layers(runner, self.layers)  # raises where chains would not be exact either
        if self.backend.trees:
            why = why or self.backend.check_layers(self.layers)
            if why is not None:
                self.backend, self.backend_reason = ChainBackend(self.backend.logit_rows), f"{CHAINS}: {why}"
                self.drafting.backend = self.backend
        if not self._confirmed:
            self._confirmed = True
            logger.info("lookahead runs %s", self.backend_reason)
            graphs = graph_modes(runner, self.backend.trees)
            if graphs is not None:
                logger.info("lookahead: %s", graphs)

    def step_has_trees(self) -> bool:
        """Whether the step under way (scheduled, not yet sampled) carries tree rows."""
        return self.step is not None and bool(self.step.attention_rows)

    def warm_up(self, runner: GPUModelRunner) -> None:
        """After vLLM's own warm-up, before the first request: the backend's (`TreeBackend.warm_up`: a GPU's
        kernels compiled), then the step-cost seed, from forward passes of 1, 2, 4, ... tokens up to the largest
        step timed now (`seed_timing.py`); each said in the log once."""
        if self.backend.trees:
            start = time.perf_counter()
            done = self.backend.warm_up(self.layers)
            if done is not None:
                logger.info("lookahead: %s backend warmed up: %s, in %.1f s", self.backend.name, done,
                            time.perf_counter() - start)  # fmt: skip
        if self.params.node_cost is not None:
            return  # fixed costs: nothing to measure
        # the most tokens a step can compute; under tensor parallelism the largest tree, so that every rank times
        # the same passes whatever its clock says
        largest = min(
            runner.max_num_tokens,
            runner.max_num_reqs + self.params.step_token_budget,
            runner.max_num_reqs * runner.uniform_decode_query_len,  # what a decode batch of vLLM's dummy run holds
        )
        ranks = self.drafting.ranks
        sizes = seed_sizes(largest if ranks == 1 else min(largest, self.params.max_tree_nodes))
        start = time.perf_counter()
        try:
            tokens, seconds = time_forwards(runner, sizes, BUDGET_SECONDS if ranks == 1 else None)
        except Exception as e:  # the sizing then starts from its prior and learns from the first steps
            logger.warning("lookahead: the start-up step timings failed (%s: %s); step sizes start from a prior",
                           type(e).__name__, e)  # fmt: skip
            return
        self.drafting.cost.seed(tokens, seconds)
        logger.info("lookahead: step costs at start-up: %s", describe(tokens, seconds, time.perf_counter() - start))

    def drop_requests(self, runner: GPUModelRunner, scheduler_output: SchedulerOutput) -> None:
        self.requests.drop_finished(runner, scheduler_output)

    def begin_step(self, runner: GPUModelRunner, scheduler_output: SchedulerOutput) -> None:
        """Match vLLM's scheduled drafts to the proposed trees and write the tree tokens' positions."""
        self.stats.steps += 1
        step, self.pending = self.pending or LookaheadStep(proposed={}, backend=self.backend), None
        self.step = step
        self.drafting.time_step(runner, scheduler_output)
        schedule_trees(step, runner, scheduler_output, self.requests.plain_greedy)
        if step.attention_rows:  # before the forward pass: what every layer's attention reads
            step.backend.prepare(step.attention_rows, step.attention_plans)
        self.drafting.timer.branched(bool(step.attention_rows))

    def forward_scope(self) -> AbstractContextManager[None]:
        """The attention backend sees this step's trees while the forward pass runs, and only then."""
        return forward_scope(self.step)

    def sample(
        self, runner: GPUModelRunner, vllm_sample: VllmSample, logits: torch.Tensor, spec_md: SpecDecodeMetadata | None
    ) -> SamplerOutput:
        """The step's sampling (`sampling.sample`: each request's x0; vLLM's rejection sampler only where lookahead
        does not sample the step), verification of the requests that carry a tree (requests with drafts this engine
        did not make keep their one token: vLLM's zero padding near max_model_len), logprobs, and the step closed."""
        step, self.step = self.step or LookaheadStep(proposed={}, backend=self.backend), None
        result = sampling.sample(runner, vllm_sample, logits, spec_md)
        paths = self.verification.verify(runner, step, result, self.layers)
        logprobs.attach(runner, result, paths)
        if step.attention_plans:
            if step.backend.used_kernel(step.attention_plans):
                self.stats.kernel_attention_steps += 1
            else:
                self.stats.reference_attention_steps += 1
        return result.sampler_output

    def propose(self, runner: GPUModelRunner, sampled_token_ids: list[list[int]]) -> list[list[int]]:
        """Next step's drafts per request; opens the step they belong to."""
        self.pending = LookaheadStep(proposed={}, backend=self.backend)
        return self.drafting.propose(runner, sampled_token_ids, self.requests, self.pending)


def worker_stats(engine: LookaheadEngine | None) -> dict[str, float | str] | None:
    """A worker's lookahead counters (None without lookahead): `LLM.collective_rpc("lookahead_stats")`."""
    if engine is None:
        return None
    s = engine.stats
    drafting = engine.drafting
    timer = drafting.timer
    return {
        "backend": engine.backend.name,
        "steps": s.steps,
        "tree_steps": s.tree_steps,
        "accepted": s.accepted,
        "sampled_accepted": s.sampled_accepted,
        "fallback_requests": s.fallback_requests,
        "preemptions": s.preemptions,
        "kernel_attention_steps": s.kernel_attention_steps,
        "reference_attention_steps": s.reference_attention_steps,
        "live_states": len(engine.requests.states),
        # the suffix tree the engine shares: the requests whose outputs it holds, and their tokens (its memory)
        "suffix_cached_requests": 0 if engine.suffix is None else engine.suffix.cached_requests(),
        "suffix_cached_tokens": 0 if engine.suffix is None else engine.suffix.cached_tokens(),
        # the decoding steps the fit was fed: how many, and their mean span and gap to the next step (seconds)
        "timed_steps": timer.timed,
        "timed_step_span": timer.span_seconds / max(timer.timed, 1),
        "timed_step_gap": timer.gap_seconds / max(timer.timed, 1),
        # the step prices the tree sizing uses at batch 1 (seconds, or relative units if fixed by node_cost)
        **drafting.cost.summary(),
        # what a node of each source is accepted at, given its parent was (depth 1), and a window slot's worth
        **{f"accept_{src.name.lower()}": engine.acceptance.factor(src, 1) for src in Source if src != Source.ROOT},
        "window_value": engine.acceptance.window_value,
        "calibration": engine.acceptance.calibration,  # greedy requests' accepted nodes per unit of carried score
        **{f"drafted_{k}": v for k, v in s.drafted.items()},
        **{f"accepted_{k}": v for k, v in s.accepted_by.items()},
        "carried_score": s.carried_score,
    }
