"""Which requests lookahead serves: greedy and sampled ones whose tokens and logprobs the tree verification gives
exactly (temperature, top-k, top-p, min-p, seed, raw logprobs); the rest take vLLM's plain path, said once per
reason."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from vllm_lookahead.core.params import LookaheadParams, RequestSettingsError

if TYPE_CHECKING:
    from vllm import SamplingParams

# SamplingParams.extra_args key: {"lookahead": False} opts a request out, {"lookahead": {...}} sets its own keys.
OPT_OUT_KEY = "lookahead"


def request_settings(sp: SamplingParams) -> bool | dict[str, Any]:
    """What a request asked for under extra_args["lookahead"]: False (opted out), True (the server's settings) or
    its own keys. Over HTTP, `vllm_xargs` carries only flat values: false arrives as 0 and true as 1, and the keys
    may come as a JSON string. Raises RequestSettingsError for anything else."""
    where = f"extra_args.{OPT_OUT_KEY}"
    value = (sp.extra_args or {}).get(OPT_OUT_KEY, True)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise RequestSettingsError(where, f"{where} is not valid JSON ({e})") from None
    if value is None or value is True or (type(value) is int and value == 1):
        return True
    if value is False or (type(value) is int and value == 0):
        return False
    if isinstance(value, dict):
        return value
    raise RequestSettingsError(where, f"{where} must be false, true or an object of lookahead keys (got {value!r})")


def request_params(server: LookaheadParams, sp: SamplingParams) -> LookaheadParams | None:
    """The parameters a request runs with: the server's, with its own settings applied; None if it opted out.
    Raises RequestSettingsError naming the key it got wrong."""
    settings = request_settings(sp)
    if settings is False:
        return None
    return server if settings is True else server.for_request(settings, where=f"extra_args.{OPT_OUT_KEY}")


# vLLM's logprobs modes whose values lookahead returns from each accepted token's own node (the raw logits of the
# target at that position, as plain decoding returns them); the processed modes would need each node's processing.
RAW_LOGPROBS_MODES = ("raw_logprobs", "raw_logits")


def ineligible_reason(
    sp: SamplingParams | None,
    honour_opt_out: bool = True,
    logprobs_mode: str = "raw_logprobs",
    server: LookaheadParams | None = None,
) -> str | None:
    """Why a request must take the plain path, or None. With `server`, a request whose own settings are invalid
    takes it too (the front end rejects such requests before they reach an engine; this is the engine's guard)."""
    if sp is None:
        return "no sampling parameters"
    if honour_opt_out:
        try:
            settings = request_settings(sp)
            if server is not None:
                request_params(server, sp)
        except RequestSettingsError as e:
            return f"the lookahead setting {e.key} is invalid"  # one log line per key, not per value
        if settings is False:
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
