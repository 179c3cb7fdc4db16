"""The vLLM glue: one object per model runner that runs lookahead for the requests of its batches.

Per step, in the runner's own order (see patches/model_runner.py):
1. `begin_step` (after `_prepare_inputs`): for each request whose drafts are this step's tree, rewrite the
   tree tokens' positions to pos(x0) + depth and publish the tree masks for the attention path.
2. the forward pass: patches/attention.py recomputes the tree rows' attention (prefix + ancestors).
3. `finish_step` (after `_sample`): greedy verification on each tree replaces vLLM's linear-chain result in
   the sampler output; the accepted nodes' KV moves to the consecutive slots vLLM expects; the window and
   pool advance with the argmax at every node.
4. `propose` (vLLM's drafter call): build each request's next tree; its nodes after the root are the drafts.
Requests that cannot use lookahead (sampling, penalties, logprobs, structured output, opt-out) get no
drafts and so take vLLM's plain path; this is said once per reason in the log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from vllm_lookahead.config import LookaheadParams
from vllm_lookahead.state import LookaheadState
from vllm_lookahead.tree import StepTree
from vllm_lookahead.tree_attention import ancestor_mask_tensor
from vllm_lookahead.verify import greedy_verify

logger = logging.getLogger("vllm_lookahead")

# SamplingParams.extra_args key: {"lookahead": False} opts a request out.
OPT_OUT_KEY = "lookahead"


@dataclass
class TreeEntry:
    """A lookahead request in the current step."""

    req_id: str
    req_index: int  # row in the input batch
    q_start: int  # its first query row (x0) in the flattened batch
    tree: StepTree  # as scheduled (cut to the scheduled drafts)
    mask: torch.Tensor | None  # [n, n] bool; None when the tree is a plain chain (the stock kernel is right)


@dataclass
class LookaheadStats:
    steps: int = 0  # target forward passes (engine steps) this runner made
    tree_steps: int = 0  # request-steps verified on a tree
    accepted: int = 0  # draft tokens accepted on trees
    fallback_requests: int = 0  # requests that took the plain path
    preemptions: int = 0  # requests preempted (their state dropped, rebuilt on their next decode step)


def nodes_per_request(step_token_budget: int, num_requests: int, max_nodes: int) -> int:
    """Tree nodes (x0 included) each of num_requests lookahead requests may schedule this step."""
    return min(max_nodes, step_token_budget // max(1, num_requests))


def _chain_tree(x0: int, drafts: list[int]) -> StepTree:
    n = len(drafts) + 1
    return StepTree(tokens=[x0, *drafts], parents=list(range(-1, n - 1)), depths=list(range(n)))


def _is_chain(tree: StepTree) -> bool:
    return all(p == u - 1 for u, p in enumerate(tree.parents))


def ineligible_reason(sampling_params: Any, honour_opt_out: bool = True) -> str | None:
    """Why a request must take the plain path, or None. Greedy is exact on the tree; the rest is linear."""
    sp = sampling_params
    if sp is None:
        return "no sampling parameters"
    extra = getattr(sp, "extra_args", None) or {}
    if honour_opt_out and extra.get(OPT_OUT_KEY) is False:
        return "opted out with extra_args={'lookahead': False}"
    if sp.temperature > 1e-5:
        return "sampling (temperature > 0) is not supported by lookahead yet"
    if sp.presence_penalty or sp.frequency_penalty or sp.repetition_penalty != 1.0:
        return "penalties are not supported by lookahead"
    if sp.logprobs is not None or getattr(sp, "prompt_logprobs", None) is not None:
        return "logprobs are not supported by lookahead"
    if getattr(sp, "structured_outputs", None) is not None:
        return "structured output is not supported by lookahead"
    if getattr(sp, "bad_words", None) or getattr(sp, "allowed_token_ids", None):
        return "bad_words / allowed_token_ids are not supported by lookahead"
    if getattr(sp, "logits_processors", None) or sp.min_tokens:
        return "logits processors / min_tokens are not supported by lookahead"
    return None


class LookaheadEngine:
    def __init__(self, params: LookaheadParams, num_speculative_tokens: int, max_model_len: int) -> None:
        self.params = params
        self.max_nodes = num_speculative_tokens + 1
        self.max_model_len = max_model_len
        self.states: dict[str, LookaheadState] = {}
        self.trees: dict[str, StepTree] = {}
        self.plan: list[TreeEntry] = []
        self.stats = LookaheadStats()
        self._said: set[str] = set()
        self._eligible: dict[str, bool] = {}

    # -- request lifetime ---------------------------------------------------------------------------------
    def drop(self, req_id: str) -> None:
        self.states.pop(req_id, None)
        self.trees.pop(req_id, None)
        self._eligible.pop(req_id, None)

    def _plain_greedy(self, runner: Any, req_id: str) -> bool:
        req_state = runner.requests.get(req_id)
        return req_state is not None and ineligible_reason(req_state.sampling_params, honour_opt_out=False) is None

    def _check_eligible(self, req_id: str, sampling_params: Any) -> bool:
        ok = self._eligible.get(req_id)
        if ok is None:
            reason = ineligible_reason(sampling_params)
            ok = reason is None
            self._eligible[req_id] = ok
            if not ok:
                self.stats.fallback_requests += 1
                if reason not in self._said:
                    self._said.add(reason)
                    logger.warning("lookahead: plain decoding for requests where %s", reason)
        return ok

    # -- step ----------------------------------------------------------------------------------------------
    def begin_step(self, runner: Any, scheduler_output: Any) -> None:
        """Plan this step's trees and write their positions (after `_prepare_inputs`)."""
        self.stats.steps += 1
        self.plan = []
        # Trees live for one step: if vLLM skips proposing (it pads drafts itself near max_model_len), none of
        # last step's trees may be matched again.
        trees, self.trees = self.trees, {}
        spec = scheduler_output.scheduled_spec_decode_tokens
        if not spec:
            return
        batch = runner.input_batch
        qsl = runner.query_start_loc.np
        computed = batch.num_computed_tokens_cpu
        positions = runner.positions
        for req_id, drafts in spec.items():
            if not drafts:
                continue
            idx = batch.req_id_to_index[req_id]
            q_start = int(qsl[idx])
            x0 = int(batch.token_ids_cpu[idx, computed[idx]])
            tree = trees.get(req_id)
            k = len(drafts)
            if tree is not None and tree.tokens[0] == x0 and tree.tokens[1 : k + 1] == list(drafts):
                tree = tree.truncate(k + 1)
            elif self._plain_greedy(runner, req_id):
                # Drafts this engine did not make (vLLM pads every request with zeros near max_model_len, or
                # placeholders): verify them as a chain, which the stock attention computes as it is. vLLM's own
                # verification of that zero padding was seen to return wrong tokens, so greedy requests,
                # opted-out ones included, are checked here against the target's argmax.
                tree = _chain_tree(x0, list(drafts))
            else:
                continue  # sampling etc.: vLLM's verification stands
            mask = None
            if not _is_chain(tree):
                mask = ancestor_mask_tensor(tree)
                depths = torch.tensor(tree.depths, dtype=positions.dtype)
                positions[q_start : q_start + tree.num_nodes] = depths + int(computed[idx])
            self.plan.append(TreeEntry(req_id, idx, q_start, tree, mask))

    def finish_step(self, runner: Any, logits: torch.Tensor, spec_md: Any, sampler_output: Any) -> None:
        """Verify every planned tree, fix the sampler output and the KV cache, advance windows and pools."""
        plan, self.plan = self.plan, []
        if not plan or spec_md is None:
            return
        from vllm.v1.sample.sampler import Sampler

        out = sampler_output.sampled_token_ids
        cu_draft = spec_md.cu_num_draft_tokens.tolist()
        num_draft = spec_md.num_draft_tokens
        slot_mapping = runner.input_batch.block_table[0].slot_mapping.cpu
        moves_src: list[int] = []
        moves_dst: list[int] = []
        for e in plan:
            n = e.tree.num_nodes
            row0 = cu_draft[e.req_index] - num_draft[e.req_index] + e.req_index
            rows = logits[row0 : row0 + n].to(torch.float32)
            argmax = Sampler.greedy_sample(rows).tolist()
            accepted, tokens = greedy_verify(e.tree, argmax)
            out[e.req_index].fill_(-1)
            out[e.req_index, : len(tokens)] = torch.tensor(tokens, dtype=out.dtype)
            for d, u in enumerate(accepted, start=1):
                if u != d:  # node u sits at slot of position P+u; vLLM expects depth d at P+d
                    moves_src.append(int(slot_mapping[e.q_start + u]))
                    moves_dst.append(int(slot_mapping[e.q_start + d]))
            state = self.states.get(e.req_id)
            if state is not None:
                state.update(e.tree, argmax, tokens)
            self.stats.tree_steps += 1
            self.stats.accepted += len(tokens) - 1
        if moves_src:
            from vllm_lookahead.kv_relocation import move_kv_slots

            move_kv_slots(runner, moves_src, moves_dst)

    def propose(self, runner: Any, sampled_token_ids: list[list[int]]) -> list[list[int]]:
        """Next step's drafts per request (input batch order): each tree's nodes after the root x0."""
        batch = runner.input_batch
        active: list[tuple[int, str, list[int]]] = []
        for i, req_id in enumerate(batch.req_ids):
            sampled = sampled_token_ids[i] if i < len(sampled_token_ids) else []
            req_state = runner.requests.get(req_id)
            if sampled and req_state is not None and self._check_eligible(req_id, req_state.sampling_params):
                active.append((i, req_id, sampled))
        drafts: list[list[int]] = [[] for _ in batch.req_ids]
        if not active:
            return drafts
        # Share the step's token budget (x0s included). Below two nodes a request gets no drafts: large batches,
        # where the target pass is compute-bound, decode plainly instead of paying for guesses.
        per_request = nodes_per_request(self.params.step_token_budget, len(active), self.max_nodes)
        if per_request < 2:
            return drafts
        for i, req_id, sampled in active:
            num_tokens = int(batch.num_tokens_no_spec[i])
            room = self.max_model_len - num_tokens  # positions left for drafts after x0
            if room <= 0:
                continue
            state = self.states.get(req_id)
            if state is None:
                prompt = batch.token_ids_cpu[i, : int(batch.num_prompt_tokens[i])].tolist()
                state = self.states[req_id] = LookaheadState(self.params, prompt)
            state.catch_up(num_tokens, lambda a, b, i=i: batch.token_ids_cpu[i, a:b].tolist())
            tree = state.build_tree(int(sampled[-1]), max_nodes=min(per_request, room + 1))
            self.trees[req_id] = tree
            drafts[i] = tree.tokens[1:]
        return drafts


def worker_stats(worker: Any) -> dict[str, int] | None:
    """For `LLM.collective_rpc(worker_stats)`: this worker's lookahead counters (None without lookahead)."""
    engine = getattr(worker.model_runner, "_lookahead", None)
    if engine is None:
        return None
    s = engine.stats
    return {
        "steps": s.steps,
        "tree_steps": s.tree_steps,
        "accepted": s.accepted,
        "fallback_requests": s.fallback_requests,
        "preemptions": s.preemptions,
        "live_states": len(engine.states),
    }
