"""Sampling a step with drafts in place of vLLM's rejection sampler, and the logprobs of the tokens it outputs.

Every request's first row (x0's) is sampled by vLLM's own sampler, exactly as plain decoding samples it; the
verification then extends the requests that carry a tree (`verification.py`). Logprobs come from each output
token's own row (for a tree, the node it was verified at).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vllm_lookahead.glue.logit_rows import row_argmax

if TYPE_CHECKING:
    from vllm.v1.outputs import LogprobsTensors, SamplerOutput
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner


def first_rows(spec_md: SpecDecodeMetadata) -> list[int]:
    """Each request's first logits row (its x0's): the logits hold every request's drafts plus one bonus row.
    (Plain Python: a twentieth of the time of the same few torch operations on a CPU.)"""
    rows, at = [], 0
    for n in spec_md.num_draft_tokens:
        rows.append(at)
        at += n + 1
    return rows


def samples_itself(runner: GPUModelRunner, spec_md: SpecDecodeMetadata | None) -> bool:
    """Whether a step's sampling is this module's: steps with drafts, except batches with `logprob_token_ids` and
    async scheduling, which keep vLLM's rejection sampler."""
    md = runner.input_batch.sampling_metadata
    return spec_md is not None and not (md.logprob_token_ids or runner.use_async_scheduling)


def sample_first_rows(
    runner: GPUModelRunner, logits: torch.Tensor, spec_md: SpecDecodeMetadata
) -> tuple[SamplerOutput, list[int] | None]:
    """vLLM's sampler over every request's x0 row; the output's other columns -1 until verification fills them.
    Where `argmax_is_the_draw`, every row's argmax stands in for the sampler, and is returned for verification to
    read (its many small operations cost about 0.1 ms a step on a CPU; verification takes the argmax anyway)."""
    first = first_rows(spec_md)
    if argmax_is_the_draw(runner):
        argmax = row_argmax(logits)
        x0 = torch.tensor([argmax[r] for r in first], dtype=torch.int32, device=logits.device)
        return _first_column(x0, spec_md), argmax
    # index_select: a fifth of the time of advanced indexing (`logits[first]`) on a CPU
    rows = logits.index_select(0, torch.tensor(first, device=logits.device))
    plain = runner.sampler(logits=rows, sampling_metadata=runner.input_batch.sampling_metadata)
    return _first_column(plain.sampled_token_ids[:, 0], spec_md), None


def argmax_is_the_draw(runner: GPUModelRunner) -> bool:
    """Whether vLLM's sampler would return each x0 row's own argmax: every request of the batch greedy, and nothing
    that changes logits before it (penalties, bad words, allowed tokens, a logit bias, min_tokens, a thinking budget,
    a custom logits processor) or asks for logprobs."""
    from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor, MinTokensLogitsProcessor

    md = runner.input_batch.sampling_metadata
    if not md.all_greedy or not md.no_penalties or md.bad_words_token_ids or md.allowed_token_ids_mask is not None:
        return False
    if md.max_num_logprobs is not None or md.logprob_token_ids:
        return False
    holder = md.thinking_budget_state_holder
    if holder is not None and holder.has_tracked_requests():
        return False
    for proc in md.logitsprocs.non_argmax_invariant:  # the builtins change nothing while they hold no request
        if isinstance(proc, MinTokensLogitsProcessor) and not proc.min_toks:
            continue
        if isinstance(proc, LogitBiasLogitsProcessor) and not proc.biases:
            continue
        return False
    return True


def _first_column(tokens: torch.Tensor, spec_md: SpecDecodeMetadata) -> SamplerOutput:
    from vllm.v1.outputs import SamplerOutput

    sampled = torch.full((tokens.shape[0], spec_md.max_spec_len + 1), -1, dtype=torch.int32, device=tokens.device)
    sampled[:, 0] = tokens
    return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None)


def logprobs(
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
    chosen = logits[rows.to(logits.device)].to(torch.float32)
    values = chosen if sampler.logprobs_mode == "raw_logits" else sampler.compute_logprobs(chosen)
    tokens = sampled.flatten().clamp(min=0).long()  # -1 (rejected places) -> 0, dropped by vLLM
    k = runner.input_batch.sampling_metadata.max_num_logprobs
    if k == -1:
        return LogprobsTensors(torch.empty(0), values, torch.empty(0))
    return sampler.gather_logprobs(values, k, tokens)
