"""Which requests lookahead serves: greedy and sampled ones whose tokens and logprobs the tree verification gives
exactly (temperature, top-k, top-p, min-p, seed, raw logprobs); the rest take vLLM's plain path, said once per
reason."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm import SamplingParams

# SamplingParams.extra_args key: {"lookahead": False} opts a request out.
OPT_OUT_KEY = "lookahead"


# vLLM's logprobs modes whose values lookahead returns from each accepted token's own node (the raw logits of the
# target at that position, as plain decoding returns them); the processed modes would need each node's processing.
RAW_LOGPROBS_MODES = ("raw_logprobs", "raw_logits")


def ineligible_reason(
    sp: SamplingParams | None, honour_opt_out: bool = True, logprobs_mode: str = "raw_logprobs"
) -> str | None:
    """Why a request must take the plain path, or None."""
    if sp is None:
        return "no sampling parameters"
    extra = sp.extra_args or {}
    if honour_opt_out and extra.get(OPT_OUT_KEY) is False:
        return "opted out with extra_args={'lookahead': False}"
    if sp.presence_penalty or sp.frequency_penalty or sp.repetition_penalty != 1.0:
        return "penalties are not supported by lookahead"
    if sp.logprobs is not None and logprobs_mode not in RAW_LOGPROBS_MODES:
        return f"logprobs in logprobs_mode {logprobs_mode!r} are not supported by lookahead"
    if sp.prompt_logprobs is not None or sp.logprob_token_ids:
        return "prompt_logprobs / logprob_token_ids are not supported by lookahead"
    if sp.structured_outputs is not None:
        return "structured output is not supported by lookahead"
    if sp.bad_words or sp.allowed_token_ids or sp.logit_bias:
        return "bad_words / allowed_token_ids / logit_bias are not supported by lookahead"
    if sp.min_tokens:
        return "min_tokens is not supported by lookahead"
    if sp.watermarking or sp.thinking_token_budget is not None:
        return "watermarking / thinking_token_budget are not supported by lookahead"
    return None
