"""The target's own next-token draw at a node of a sampled request's tree, made the way vLLM's sampler makes it.

vLLM's `Sampler` turns a request's row of logits into its next token in this order: float32, temperature, the
argmax-invariant logits processors (min-p, built in), then `TopKTopPSampler`: top-k and top-p, and one random draw
(on CPU: one seed from the request's generator, or the global one, then a Gumbel-max over the logits). `draw` runs
those steps on one tree node's row, with the request's values read from vLLM's own `SamplingMetadata` (and its
min-p processor) and vLLM's own `TopKTopPSampler`, so a seeded request consumes its generator exactly as plain
decoding does: one draw per generated token. Requests whose distribution needs anything else (penalties, logit bias,
bad words, allowed tokens, logprobs in a processed logprobs_mode) are not drafted for (eligibility.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: below it a request is greedy


def is_greedy(md: SamplingMetadata, req_index: int) -> bool:
    if md.all_greedy:
        return True
    return md.temperature is None or float(md.temperature[req_index]) < GREEDY_EPS


def processed_logits(row: torch.Tensor, md: SamplingMetadata, req_index: int) -> torch.Tensor:
    """[vocab] logits -> [1, vocab] float32 after temperature and min-p, as `Sampler.sample` has them before top-k/p."""
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor

    assert md.temperature is not None
    logits = row.to(torch.float32, copy=True).unsqueeze(0)
    logits.div_(md.temperature[req_index : req_index + 1].unsqueeze(1))
    for proc in md.logitsprocs.argmax_invariant:
        if isinstance(proc, MinPLogitsProcessor):
            min_p = proc.get_min_p_by_index(req_index)
            if min_p:  # MinPLogitsProcessor.apply, for this request's min_p
                probs = torch.softmax(logits, dim=-1)
                logits.masked_fill_(probs < probs.amax(dim=-1, keepdim=True) * min_p, -float("inf"))
        else:
            raise RuntimeError(f"lookahead: cannot apply logits processor {type(proc).__name__} on a tree")
    return logits


def draw(sampler: Sampler, row: torch.Tensor, md: SamplingMetadata, req_index: int) -> int:
    """The token vLLM's sampler draws from this row of logits for this request (one draw from its generator)."""
    logits = processed_logits(row, md, req_index)
    k = None if md.top_k is None else md.top_k[req_index : req_index + 1]
    p = None if md.top_p is None else md.top_p[req_index : req_index + 1]
    gen = md.generators.get(req_index)
    sampled, _ = sampler.topk_topp_sampler(logits, {} if gen is None else {0: gen}, k, p)
    return int(sampled[0])
