"""Which requests lookahead serves: greedy and sampled ones whose next-token distribution the tree verification
reproduces exactly (temperature, top-k, top-p, min-p, seed); the rest take vLLM's plain path, said once per reason."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm import SamplingParams

# SamplingParams.extra_args key: {"lookahead": False} opts a request out.
OPT_OUT_KEY = "lookahead"


def ineligible_reason(sp: SamplingParams | None, honour_opt_out: bool = True) -> str | None:
    """Why a request must take the plain path, or None."""
    if sp is None:
        return "no sampling parameters"
    extra = sp.extra_args or {}
    if honour_opt_out and extra.get(OPT_OUT_KEY) is False:
        return "opted out with extra_args={'lookahead': False}"
    if sp.presence_penalty or sp.frequency_penalty or sp.repetition_penalty != 1.0:
        return "penalties are not supported by lookahead"
    if sp.logprobs is not None or sp.prompt_logprobs is not None or sp.logprob_token_ids:
        return "logprobs are not supported by lookahead"
    if sp.structured_outputs is not None:
        return "structured output is not supported by lookahead"
    if sp.bad_words or sp.allowed_token_ids or sp.logit_bias:
        return "bad_words / allowed_token_ids / logit_bias are not supported by lookahead"
    if sp.min_tokens:
        return "min_tokens is not supported by lookahead"
    if sp.watermarking or sp.thinking_token_budget is not None:
        return "watermarking / thinking_token_budget are not supported by lookahead"
    return None
