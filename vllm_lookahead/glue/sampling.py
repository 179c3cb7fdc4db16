"""Sampling a step with drafts in place of vLLM's rejection sampler.

Every request's first row (x0's) is sampled by vLLM's own sampler, exactly as plain decoding samples it, or is its
argmax where that is the draw; the verification then extends the requests that carry a tree (`verification.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from vllm_lookahead.backends.staging import to_device
from vllm_lookahead.glue.step import StepResult

if TYPE_CHECKING:
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

VllmSample = Callable[["GPUModelRunner", torch.Tensor, "SpecDecodeMetadata | None"], "SamplerOutput"]


def first_rows(spec_md: SpecDecodeMetadata) -> list[int]:
    """Each request's first logits row (its x0's): the logits hold every request's drafts plus one bonus row.
    (Plain Python: cheaper than torch operations on a list this short.)"""
    rows, at = [], 0
    for n in spec_md.num_draft_tokens:
        rows.append(at)
        at += n + 1
    return rows


def sample(
    runner: GPUModelRunner, vllm_sample: VllmSample, logits: torch.Tensor, spec_md: SpecDecodeMetadata | None
) -> StepResult:
    """The step's sampling. A step with drafts does not run vLLM's rejection sampler (`samples_itself`): every
    request's x0 row is sampled by vLLM's own sampler, or left to verification where its argmax is the draw, and the
    output's other columns are -1 until verification fills them. A step without a single draft token is sampled as
    vLLM samples without speculation: vLLM 0.32's rejection sampler fails on CPU on such a step when a request uses
    top-k (`apply_top_k_only` on an empty tensor)."""
    if spec_md is not None and not any(spec_md.num_draft_tokens):
        spec_md = None
    first = [] if spec_md is None else first_rows(spec_md)
    if not samples_itself(runner, spec_md):
        return StepResult(logits, spec_md, vllm_sample(runner, logits, spec_md), first, False, False)
    assert spec_md is not None
    if argmax_is_the_draw(runner):
        # vLLM's sampler's many small operations cost more than the argmax verification takes of every row anyway
        return StepResult(logits, spec_md, _output(spec_md, len(first), logits.device), first, True, True)
    # index_select: cheaper than advanced indexing (`logits[first]`) on a CPU; the rows' index in one upload on a GPU
    rows = logits.index_select(0, to_device(first, torch.int64, logits.device))
    plain = runner.sampler(logits=rows, sampling_metadata=runner.input_batch.sampling_metadata)
    x0 = plain.sampled_token_ids[:, 0]
    return StepResult(logits, spec_md, _output(spec_md, len(first), x0.device, x0), first, True, False)


def samples_itself(runner: GPUModelRunner, spec_md: SpecDecodeMetadata | None) -> bool:
    """Whether a step's sampling is this module's: steps with drafts, except batches with `logprob_token_ids` and
    async scheduling, which keep vLLM's rejection sampler."""
    md = runner.input_batch.sampling_metadata
    return spec_md is not None and not (md.logprob_token_ids or runner.use_async_scheduling)


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


def _output(
    spec_md: SpecDecodeMetadata, num_reqs: int, device: torch.device, x0: torch.Tensor | None = None
) -> SamplerOutput:
    """The step's sampler output: -1 everywhere but column 0, which holds `x0` where given."""
    from vllm.v1.outputs import SamplerOutput

    sampled = torch.full((num_reqs, spec_md.max_spec_len + 1), -1, dtype=torch.int32, device=device)
    if x0 is not None:
        sampled[:, 0] = x0
    return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None)
