"""The vLLM glue: one LookaheadEngine per model runner runs lookahead for the requests of its batches.

Each vLLM hook (patches/model_runner.py) calls exactly one method here, in the runner's own order:
- `drop_requests` (`_update_states`): per-request state goes when a request finishes, is preempted or resumes.
- `begin_step` (after `_prepare_inputs`): the step opened by the last `propose` learns what vLLM scheduled;
  tree tokens get positions pos(x0) + depth (written into `runner.positions`, after vLLM derived the KV slots
  from the linear positions).
- `forward_scope` (around `_model_forward`): the attention path sees the step while the forward pass runs.
- `sample` (`_sample`): vLLM's sampling, then `finish_step`: greedy or sampling verification on each tree
  replaces vLLM's linear-chain result in the sampler output rows; accepted nodes' KV moves to the consecutive
  slots vLLM expects; windows and pools advance with the argmax at every node; the step closes.
- `propose` (vLLM's drafter call): each lookahead request's next tree; its nodes after the root are the drafts.
Those three writes into vLLM's data (positions, sampler output rows, KV slots) are the only ones; everything
that replaces vLLM code is in patches/.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch

from vllm_lookahead.backends import ChainBackend, TreeBackend
from vllm_lookahead.backends.base import TreeRows
from vllm_lookahead.core.acceptance import AcceptanceStats
from vllm_lookahead.core.corpus import read_corpus
from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.core.pool import NGramPool
from vllm_lookahead.core.recycle import TokenRecycler
from vllm_lookahead.core.sizing import StepCost, StepTimer, choose_sizes, plan_step, score_floor
from vllm_lookahead.core.state import LookaheadState
from vllm_lookahead.core.suffix import SuffixCandidates
from vllm_lookahead.core.tree import Source, StepTree
from vllm_lookahead.core.verify import draw_verify, greedy_verify, row_argmax, row_topk
from vllm_lookahead.glue.eligibility import ineligible_reason, request_params
from vllm_lookahead.glue.step import LookaheadStep, ScheduledTree, forward_scope
from vllm_lookahead.glue.target_dist import GREEDY_EPS, draw, is_greedy

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import LogprobsTensors, SamplerOutput
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

logger = logging.getLogger("vllm_lookahead")


SOURCE_NAMES = [s.name.lower() for s in Source if s != Source.ROOT]
# worker_stats' names of StepCost.coefficients()
COST_KEYS = (
    "step_cost_fixed",
    "step_cost_per_request",
    "step_cost_per_draft",
    "step_cost_branch",
    "step_cost_knee",
    "step_cost_per_draft_below_knee",
)


@dataclass
class LookaheadStats:
    steps: int = 0  # target forward passes (engine steps) this runner made
    tree_steps: int = 0  # request-steps verified on a tree
    accepted: int = 0  # draft tokens accepted on trees
    sampled_accepted: int = 0  # of those, accepted for sampled (temperature > 0) requests
    fallback_requests: int = 0  # requests that took the plain path
    preemptions: int = 0  # requests preempted (their state dropped, rebuilt on their next decode step)
    kernel_attention_steps: int = 0  # steps whose tree rows the compiled kernel computed
    reference_attention_steps: int = 0  # steps whose tree rows the plain-torch path recomputed
    # per candidate source (Source names): tree nodes verified, and those accepted
    drafted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCE_NAMES, 0))
    accepted_by: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCE_NAMES, 0))
    # the verified draft nodes' summed scores: against the accepted ones (accepted_by's sum), how far the scores of
    # the nodes steps carry (the best-scored ones) overstate what verification accepts
    carried_score: float = 0.0


class LookaheadEngine:
    def __init__(
        self,
        params: LookaheadParams,
        max_model_len: int,
        ranks: int = 1,
        tokenize: Callable[[str], list[int]] | None = None,
        backend: TreeBackend | None = None,
    ) -> None:
        self.params = params
        # Who computes the tree rows' attention and moves accepted KV; the chain backend drafts chains only.
        self.backend = backend if backend is not None else ChainBackend()
        self.max_model_len = max_model_len
        # Under tensor parallelism every rank must build the same trees, but each sizes them from its own step
        # timings: there the trees are built whole and only cut to the driver's scheduled drafts (begin_step).
        self.ranks = ranks
        self.states: dict[str, LookaheadState] = {}
        self.stats = LookaheadStats()
        # Shared by all requests: what nodes of each source turn out to be worth, what a step costs, and the
        # suffix trees (with earlier requests' outputs).
        # Greedy and sampled requests accept at different rates: each kind learns its own.
        self.acceptance = AcceptanceStats()
        self.acceptance_sampled = AcceptanceStats()
        self.cost = StepCost(params.node_cost)
        self.suffix = SuffixCandidates.create(params.suffix_depth, params.suffix_cache_requests)
        if params.suffix_corpus:
            self._load_corpus(params.suffix_corpus, tokenize)
        self.recycle = TokenRecycler() if params.recycle_candidates else None
        # Whether the last drafted step's bar let recycled guesses in (`_recycle_may_pay`): the table is taught then.
        self._recycling_pays = self.recycle is not None
        self.shared_pool = (
            NGramPool(params.ngram_size, params.guess_set_size, params.shared_pool_keys)
            if params.shared_pool_keys
            else None
        )
        # Pure decoding steps timed for the fit, from begin_step to the next one (the engine's work between included).
        self.timer = StepTimer()
        self.pending: LookaheadStep | None = None  # opened by propose, scheduled by begin_step
        self.step: LookaheadStep | None = None  # the step under way, closed by finish_step
        self._said: set[str] = set()
        self._eligible: dict[str, bool] = {}

    def _load_corpus(self, path: str, tokenize: Callable[[str], list[int]] | None) -> None:
        """The suffix corpus into the global suffix tree (`corpus.py`), tokenized by the served model's tokenizer."""
        if self.suffix is None or not self.params.suffix_candidates:  # the latter only where built without a server
            why = "no arctic_inference" if self.suffix is None else "suffix_candidates is 0"
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
        self.suffix.seed(outputs)
        logger.info(
            "lookahead: suffix corpus %s: %d texts, %d tokens, %d held (suffix_cache_requests %d), in %.1f s",
            path, len(outputs), sum(map(len, outputs)), self.suffix.cached_requests(),
            self.params.suffix_cache_requests, time.perf_counter() - start,
        )  # fmt: skip

    # -- request lifetime ---------------------------------------------------------------------------------
    def drop_requests(self, scheduler_output: SchedulerOutput) -> None:
        """Forget finished, preempted and resumed requests (a resumed one rebuilds its state on its next step)."""
        for req_id in scheduler_output.finished_req_ids:
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

    def _check_eligible(self, runner: GPUModelRunner, req_id: str) -> bool:
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

    # -- step ----------------------------------------------------------------------------------------------
    def begin_step(self, runner: GPUModelRunner, scheduler_output: SchedulerOutput) -> None:
        """Match vLLM's scheduled drafts to the proposed trees and write the tree tokens' positions."""
        self.stats.steps += 1
        step, self.pending = self.pending or LookaheadStep(proposed={}, backend=self.backend), None
        self.step = step
        spec = scheduler_output.scheduled_spec_decode_tokens
        # Time pure decoding steps (every request computes x0 and its drafts) for the step-cost fit.
        tokens = scheduler_output.total_num_scheduled_tokens
        requests = runner.input_batch.num_reqs
        decoding = tokens == requests + sum(len(d) for d in spec.values())
        timed = self.timer.begin(time.perf_counter(), requests, tokens - requests if decoding else None)
        if timed is not None:
            self.cost.observe(*timed)
        if not spec:
            return
        batch = runner.input_batch
        qsl = runner.query_start_loc.np
        computed = batch.num_computed_tokens_cpu
        block_table = batch.block_table[0].get_cpu_tensor()
        positions = runner.positions
        for req_id, drafts in spec.items():
            if not drafts:
                continue
            idx = batch.req_id_to_index[req_id]
            prefix_len = int(computed[idx])
            x0 = int(batch.token_ids_cpu[idx, prefix_len])
            tree = step.proposed.get(req_id)
            k = len(drafts)
            ours = tree is not None and tree.tokens[0] == x0 and tree.tokens[1 : k + 1] == list(drafts)
            if ours:
                tree = tree.truncate(k + 1)  # the scheduler may schedule a prefix of the drafts
            elif self._plain_greedy(runner, req_id):
                # Drafts this engine did not make (vLLM pads every request with zeros near max_model_len): verify
                # them as a chain, which the stock attention computes as it is. vLLM's own verification of that
                # padding was seen to return wrong tokens, so greedy requests (opted-out ones too) are checked here.
                tree = StepTree.chain([x0, *drafts])
            else:
                continue  # sampling etc.: vLLM's verification stands
            q_start = int(qsl[idx])
            step.scheduled.append(ScheduledTree(req_id, idx, q_start, prefix_len, tree, ours))
            if not tree.is_chain:
                n = tree.num_nodes
                positions[q_start : q_start + n] = torch.tensor(tree.depths, dtype=positions.dtype) + prefix_len
                step.attention_rows.append(
                    TreeRows(idx, q_start, n, prefix_len + n, block_table[idx], tree.ancestor_mask())
                )
        self.timer.branched(bool(step.attention_rows))

    @staticmethod
    def _plain_greedy(runner: GPUModelRunner, req_id: str) -> bool:
        req_state = runner.requests.get(req_id)
        if req_state is None or req_state.sampling_params is None:
            return False
        sp = req_state.sampling_params
        reason = ineligible_reason(sp, honour_opt_out=False, logprobs_mode=runner.sampler.logprobs_mode)
        return sp.temperature < GREEDY_EPS and reason is None

    def forward_scope(self) -> AbstractContextManager[None]:
        """The attention path sees this step's trees while the forward pass runs, and only then."""
        return forward_scope(self.step)

    def sample(
        self,
        runner: GPUModelRunner,
        vllm_sample: Callable[[GPUModelRunner, torch.Tensor, SpecDecodeMetadata | None], SamplerOutput],
        logits: torch.Tensor,
        spec_md: SpecDecodeMetadata | None,
    ) -> SamplerOutput:
        """The step's sampling, then `finish_step`.

        A step with drafts does not run vLLM's rejection sampler: every request's first row (x0's) is sampled by
        vLLM's own sampler, exactly as plain decoding samples it, and `finish_step` extends the requests that
        carry a tree. Requests with drafts this engine did not make keep that one token (vLLM's zero padding near
        max_model_len). Logprobs come from each output token's own row (for a tree, the node it was verified at).
        vLLM's rejection sampler still runs for batches with `logprob_token_ids` and for async scheduling.
        A step without a single draft token is sampled as vLLM samples without speculation: vLLM 0.32's rejection
        sampler fails on CPU on such a step when a request uses top-k (`apply_top_k_only` on an empty tensor).
        """
        if spec_md is not None and not any(spec_md.num_draft_tokens):
            spec_md = None
        md = runner.input_batch.sampling_metadata
        own = spec_md is not None and not (md.logprob_token_ids or runner.use_async_scheduling)
        if own:
            sampler_output = self._sample_first_rows(runner, logits, spec_md)
        else:
            sampler_output = vllm_sample(runner, logits, spec_md)
        paths = self.finish_step(runner, logits, spec_md, sampler_output, first_rows_sampled=own)
        if own and md.max_num_logprobs is not None:
            sampler_output.logprobs_tensors = _logprobs(runner, logits, spec_md, sampler_output, paths)
        return sampler_output

    @staticmethod
    def _sample_first_rows(runner: GPUModelRunner, logits: torch.Tensor, spec_md: SpecDecodeMetadata) -> SamplerOutput:
        from vllm.v1.outputs import SamplerOutput

        first = first_rows(spec_md)
        # index_select: a fifth of the time of advanced indexing (`logits[first]`) on a CPU
        rows = logits.index_select(0, torch.tensor(first))
        plain = runner.sampler(logits=rows, sampling_metadata=runner.input_batch.sampling_metadata)
        sampled = plain.sampled_token_ids.new_full((len(first), spec_md.max_spec_len + 1), -1)
        sampled[:, 0] = plain.sampled_token_ids[:, 0]
        return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None)

    def finish_step(
        self,
        runner: GPUModelRunner,
        logits: torch.Tensor,
        spec_md: SpecDecodeMetadata | None,
        sampler_output: SamplerOutput,
        first_rows_sampled: bool = False,
    ) -> dict[int, list[int]]:
        """Verify every scheduled tree, fix the sampler output and the KV cache, advance windows and pools.
        first_rows_sampled: column 0 of the sampler output holds vLLM's draw at each request's x0 row.
        Returns each verified request's path (input batch index -> tree nodes of its output tokens, root first)."""
        step, self.step = self.step, None
        paths: dict[int, list[int]] = {}
        if step is not None and step.scheduled and spec_md is not None:
            paths = self._verify(runner, step, logits, spec_md, sampler_output, first_rows_sampled)
        if step is not None and step.attention_plans:
            if self.backend.used_kernel(step.attention_plans):
                self.stats.kernel_attention_steps += 1
            else:
                self.stats.reference_attention_steps += 1
        return paths

    def _verify(
        self,
        runner: GPUModelRunner,
        step: LookaheadStep,
        logits: torch.Tensor,
        spec_md: SpecDecodeMetadata,
        sampler_output: SamplerOutput,
        first_rows_sampled: bool,
    ) -> dict[int, list[int]]:
        md = runner.input_batch.sampling_metadata
        out = sampler_output.sampled_token_ids
        # Written through a numpy view: a tenth of the time of two torch operations a request on a CPU.
        out_rows = out.numpy()
        row0 = first_rows(spec_md)
        slot_mapping = runner.input_batch.block_table[0].slot_mapping.cpu
        moves_src: list[int] = []
        moves_dst: list[int] = []
        paths: dict[int, list[int]] = {}
        # The target's argmax at every row, as vLLM's greedy sampler takes it, in one call for the whole step: a call
        # per tree made verification 3.0 instead of 2.3 ms a step at 16 bfloat16 requests.
        argmax_all = row_argmax(logits)
        verified = []
        for s in step.scheduled:
            n = s.tree.num_nodes
            first_row = row0[s.req_index]
            rows = logits[first_row : first_row + n]
            argmax = argmax_all[first_row : first_row + n]
            greedy = is_greedy(md, s.req_index)
            if greedy:
                accepted, tokens = greedy_verify(s.tree, argmax)
            else:
                # The target's own draws along the tree (vLLM's sampler at x0, `draw` below it): exact, and for a
                # seeded request the tokens plain decoding gives. The window still advances with the argmax.
                first = int(out_rows[s.req_index, 0]) if first_rows_sampled else None
                accepted, tokens = draw_verify(s.tree, partial(_draw_at, runner.sampler, md, s.req_index, rows, first))
            out_rows[s.req_index] = -1
            out_rows[s.req_index, : len(tokens)] = tokens
            paths[s.req_index] = [0, *accepted]
            for d, u in enumerate(accepted, start=1):
                if u != d:  # node u sits at the slot of position P+u; vLLM expects depth d at P+d
                    moves_src.append(int(slot_mapping[s.q_start + u]))
                    moves_dst.append(int(slot_mapping[s.q_start + d]))
            verified.append((s, argmax, accepted, tokens, greedy))
        # Token recycling learns the target's top tokens at the rows the sequences went through: one call for all.
        top = self._path_top(logits, row0, verified, paths)
        for s, argmax, accepted, tokens, greedy in verified:
            state = self.states.get(s.req_id)
            if state is not None:
                state.update(s.tree, argmax, tokens, top.get(s.req_index))
            if s.ours and state is not None:
                # The nodes' rates are learned by the state in hindsight, over its whole tree; the window's worth here.
                state.stats.observe_window(s.tree, accepted)
                self.stats.carried_score += sum(s.tree.scores[1:])
                sources = s.tree.sources
                for u in range(1, s.tree.num_nodes):
                    self.stats.drafted[SOURCE_NAMES[sources[u] - 1]] += 1
                for u in accepted:
                    self.stats.accepted_by[SOURCE_NAMES[sources[u] - 1]] += 1
            self.stats.tree_steps += 1
            self.stats.accepted += len(tokens) - 1
            if not greedy:
                self.stats.sampled_accepted += len(tokens) - 1
        if moves_src:
            self.backend.relocate(attention_layers(runner), moves_src, moves_dst)
        return paths

    def _path_top(
        self, logits: torch.Tensor, row0: list[int], verified: list, paths: dict[int, list[int]]
    ) -> dict[int, list[list[int]]]:
        """Per request index whose state recycles tokens: the target's top tokens (best first) at each row of its
        path (x0 and the accepted nodes). None where the last drafted step's bar kept recycled guesses out."""
        if self.recycle is None or not self._recycling_pays:
            return {}
        want = [s.req_index for s, *_ in verified if (st := self.states.get(s.req_id)) is not None and st.recycle]
        if not want:
            return {}
        rows = [row0[i] + u for i in want for u in paths[i]]
        top = row_topk(logits.index_select(0, torch.tensor(rows)), self.recycle.top_k)
        out, at = {}, 0
        for i in want:
            out[i] = top[at : at + len(paths[i])]
            at += len(paths[i])
        return out

    def _recycle_may_pay(self, floor: float, stats: Sequence[AcceptanceStats]) -> bool:
        """Whether a recycled guess under x0 could clear a step's bar (`score_floor`), as its depth-1 rate in the
        step's requests' statistics (`stats`: greedy, sampled or both) says: the recycling table is taught only then.
        The target's top-k along every path costs 0.3-0.6 ms of a 42-52 ms step at 16 requests, where the bar keeps
        recycled guesses out (2 accepted of 45 drafted in some 3000 request-steps at 16 ShareGPT requests); the table
        stays for when the batch shrinks. Only the kinds of request in the step count: the sampled statistics' rate
        stays at its prior (1) in a greedy run and would let every bar in. The rule reads no table, so an empty one is
        taught. Under tensor parallelism (floor 0) every rank always teaches it, so that their tables stay equal."""
        if self.recycle is None:
            return False
        if floor <= 0:
            return True
        rate = max((s.factor(Source.RECYCLE, 1) for s in stats), default=0.0)
        return self.recycle.best_estimate(rate) > floor

    def propose(self, runner: GPUModelRunner, sampled_token_ids: list[list[int]]) -> list[list[int]]:
        """Next step's drafts per request (input batch order): each tree's best nodes after the root x0, as many as
        the fitted step cost says pay (`sizing.plan_step`). Ends a decoding step's own span, drafting included; the
        step-cost fit learns it with the engine's work until the next `begin_step` (`sizing.StepTimer`)."""
        try:
            return self._draft(runner, sampled_token_ids)
        finally:
            self.timer.end(time.perf_counter())

    def _draft(self, runner: GPUModelRunner, sampled_token_ids: list[list[int]]) -> list[list[int]]:
        batch = runner.input_batch
        drafts: list[list[int]] = [[] for _ in batch.req_ids]
        step = self.pending = LookaheadStep(proposed={}, backend=self.backend)
        rows: list[tuple[int, str]] = []
        ready: list[tuple[LookaheadState, int]] = []
        caps: list[int] = []
        for i, req_id in enumerate(batch.req_ids):
            sampled = sampled_token_ids[i] if i < len(sampled_token_ids) else []
            if not sampled or not self._check_eligible(runner, req_id):
                continue
            num_tokens = int(batch.num_tokens_no_spec[i])
            room = self.max_model_len - num_tokens  # positions left for drafts after x0
            if room <= 0:
                continue
            state = self.states.get(req_id)
            if state is None:
                prompt = batch.token_ids_cpu[i, : int(batch.num_prompt_tokens[i])].tolist()
                sp = runner.requests[req_id].sampling_params
                random = sp.temperature >= GREEDY_EPS
                state = self.states[req_id] = LookaheadState(
                    request_params(self.params, sp) or self.params,  # its own settings (checked when eligible)
                    prompt,
                    stats=self.acceptance_sampled if random else self.acceptance,
                    suffix=self.suffix,
                    req_id=req_id,
                    shared=self.shared_pool,
                    recycle=self.recycle,
                )
            state.catch_up(num_tokens, lambda a, b, i=i: batch.token_ids_cpu[i, a:b].tolist())
            rows.append((i, req_id))
            ready.append((state, int(sampled[-1])))
            caps.append(room + 1)
        budget = self.params.step_token_budget - len(ready)
        if not ready or budget <= 0:
            return drafts  # no room for a single draft token this step: the states have learned, nothing to build
        # Nodes the sizing below would never take are not drafted (large batches on a CPU: most of them).
        floor = score_floor(self.cost, batch.num_reqs) if self.ranks == 1 else 0.0
        self._recycling_pays = self._recycle_may_pay(floor, [state.stats for state, _ in ready])
        trees = [state.build_tree(x0, min_score=floor) for state, x0 in ready]
        if not self.backend.trees:  # no tree attention here: each request's best chain
            trees = [t.best_chain() for t in trees]
        if self.ranks == 1:
            # Where the tree attention path costs more than its branches bring, each request's best chain alone.
            trees, sizes = plan_step(trees, caps, batch.num_reqs, self.cost, budget)
        else:
            sizes = choose_sizes(trees, caps, batch.num_reqs, self.cost, budget).sizes
        for (i, req_id), tree, size in zip(rows, trees, sizes, strict=True):
            # The whole tree is kept and vLLM gets its first `size` nodes: begin_step cuts the tree to what was
            # scheduled. Under tensor parallelism every rank builds the same tree from the same state, but only the
            # driver's drafts are scheduled and the sizes follow each rank's own step timings; so every rank cuts
            # the same tree at the driver's size. Under two nodes there is nothing to draft: the request decodes
            # plainly this step (large batches, where tokens are dear, and requests whose candidates are unlikely).
            step.proposed[req_id] = tree
            if size > 1:
                drafts[i] = tree.tokens[1:size]
        return drafts


def attention_layers(runner: GPUModelRunner) -> list:
    """The runner's attention layers that own a KV cache (found once; the same list every step)."""
    found = getattr(runner, "_lookahead_attn_layers", None)
    if found is None:
        ctx = runner.compilation_config.static_forward_context
        found = [m for m in ctx.values() if hasattr(m, "kv_cache") and hasattr(m, "impl")]
        runner._lookahead_attn_layers = found
    return found


def first_rows(spec_md: SpecDecodeMetadata) -> list[int]:
    """Each request's first logits row (its x0's): the logits hold every request's drafts plus one bonus row.
    (Plain Python: a twentieth of the time of the same few torch operations on a CPU.)"""
    rows, at = [], 0
    for n in spec_md.num_draft_tokens:
        rows.append(at)
        at += n + 1
    return rows


def worker_stats(engine: LookaheadEngine | None) -> dict[str, float] | None:
    """A worker's lookahead counters (None without lookahead), for `LLM.collective_rpc("lookahead_stats")`."""
    if engine is None:
        return None
    s = engine.stats
    return {
        "steps": s.steps,
        "tree_steps": s.tree_steps,
        "accepted": s.accepted,
        "sampled_accepted": s.sampled_accepted,
        "fallback_requests": s.fallback_requests,
        "preemptions": s.preemptions,
        "kernel_attention_steps": s.kernel_attention_steps,
        "reference_attention_steps": s.reference_attention_steps,
        "live_states": len(engine.states),
        # the suffix tree the engine shares: the requests whose outputs it holds, and their tokens (its memory)
        "suffix_cached_requests": 0 if engine.suffix is None else engine.suffix.cached_requests(),
        "suffix_cached_tokens": 0 if engine.suffix is None else engine.suffix.cached_tokens(),
        # the decoding steps the fit was fed: how many, and their mean span and gap to the next step (seconds)
        "timed_steps": engine.timer.timed,
        "timed_step_span": engine.timer.span_seconds / max(engine.timer.timed, 1),
        "timed_step_gap": engine.timer.gap_seconds / max(engine.timer.timed, 1),
        # the step-cost fit the tree sizing uses (seconds, or relative units if fixed by node_cost)
        **dict(zip(COST_KEYS, engine.cost.coefficients(), strict=True)),
        # what a node of each source is accepted at, given its parent was (depth 1), and a window slot's worth
        **{f"accept_{src.name.lower()}": engine.acceptance.factor(src, 1) for src in Source if src != Source.ROOT},
        "window_value": engine.acceptance.window_value,
        **{f"drafted_{k}": v for k, v in s.drafted.items()},
        **{f"accepted_{k}": v for k, v in s.accepted_by.items()},
        "carried_score": s.carried_score,
    }


def _draw_at(
    sampler: Sampler, md: SamplingMetadata, req_index: int, rows: torch.Tensor, first: int | None, u: int
) -> int:
    """The target's token at tree node u: vLLM's own draw at x0 when the step sampled it, else `draw`."""
    if u == 0 and first is not None:
        return first
    return draw(sampler, rows[u], md, req_index)


def _logprobs(
    runner: GPUModelRunner,
    logits: torch.Tensor,
    spec_md: SpecDecodeMetadata,
    sampler_output: SamplerOutput,
    paths: dict[int, list[int]],
) -> LogprobsTensors:
    """Logprobs in the layout vLLM's rejection sampler returns ([requests x (max_spec_len + 1)] rows, rejected
    places dropped later by vLLM): output token j of a request comes from its row j, of a tree request from the row
    of node path[j]. Raw modes only (eligibility.RAW_LOGPROBS_MODES): the target's logits there, as plain decoding."""
    from vllm.v1.outputs import LogprobsTensors

    sampler = runner.sampler
    sampled = sampler_output.sampled_token_ids
    num_reqs, width = sampled.shape
    start = torch.tensor(first_rows(spec_md))
    offsets = torch.arange(width).expand(num_reqs, width).clone()
    for i, path in paths.items():
        offsets[i, : len(path)] = torch.tensor(path)
    rows = (start.unsqueeze(1) + offsets).flatten().clamp_(max=logits.shape[0] - 1)
    chosen = logits[rows].to(torch.float32)
    values = chosen if sampler.logprobs_mode == "raw_logits" else sampler.compute_logprobs(chosen)
    tokens = sampled.flatten().clamp(min=0).long()  # -1 (rejected places) -> 0, dropped by vLLM
    k = runner.input_batch.sampling_metadata.max_num_logprobs
    if k == -1:
        return LogprobsTensors(torch.empty(0), values, torch.empty(0))
    return sampler.gather_logprobs(values, k, tokens)
