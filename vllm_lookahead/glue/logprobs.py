"""The logprobs of a step's output tokens where lookahead sampled it: each token's from its own row (for a tree, the
row of the node it was verified at), in the layout vLLM's rejection sampler returns."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vllm_lookahead.backends.staging import to_device
from vllm_lookahead.glue.step import StepResult

if TYPE_CHECKING:
    from vllm.v1.outputs import LogprobsTensors
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner


def attach(runner: GPUModelRunner, result: StepResult, paths: dict[int, list[int]]) -> None:
    """The step's logprobs into its sampler output, where they are asked for and lookahead sampled the step (vLLM's
    rejection sampler gives its own). paths: each verified request's tree nodes of its output tokens."""
    if result.first_rows_sampled and runner.input_batch.sampling_metadata.max_num_logprobs is not None:
        result.sampler_output.logprobs_tensors = _logprobs(runner, result, paths)


def _logprobs(runner: GPUModelRunner, result: StepResult, paths: dict[int, list[int]]) -> LogprobsTensors:
    """[requests x (max_spec_len + 1)] rows, rejected places dropped later by vLLM: output token j of a request comes
    from its row j, of a tree request from the row of node path[j]. Raw modes only (eligibility.RAW_LOGPROBS_MODES):
    the target's logits there, as plain decoding."""
    from vllm.v1.outputs import LogprobsTensors

    sampler = runner.sampler
    logits = result.logits
    sampled = result.sampler_output.sampled_token_ids
    num_reqs, width = sampled.shape
    start = torch.tensor(result.first_rows)
    offsets = torch.arange(width).expand(num_reqs, width).clone()
    for i, path in paths.items():
        offsets[i, : len(path)] = torch.tensor(path)
    rows = (start.unsqueeze(1) + offsets).flatten().clamp_(max=logits.shape[0] - 1)
    chosen = logits[to_device(rows.numpy(), torch.int64, logits.device)].to(torch.float32)  # one upload
    values = chosen if sampler.logprobs_mode == "raw_logits" else sampler.compute_logprobs(chosen)
    tokens = sampled.flatten().clamp(min=0).long()  # -1 (rejected places) -> 0, dropped by vLLM
    k = runner.input_batch.sampling_metadata.max_num_logprobs
    if k == -1:
        return LogprobsTensors(torch.empty(0), values, torch.empty(0))
    return sampler.gather_logprobs(values, k, tokens)
