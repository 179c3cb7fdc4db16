"""Input validation: a request's own lookahead settings are checked where vLLM checks its sampling parameters.

An invalid `extra_args["lookahead"]` (an unknown key, a value out of [minimum, the server's value]) is then refused
for that request alone, as vLLM refuses a bad sampling parameter: an error offline, a 400 naming the key over HTTP.
"""

from __future__ import annotations

from vllm_lookahead.core.params import RequestSettingsError
from vllm_lookahead.glue.eligibility import request_params
from vllm_lookahead.glue.patches.base import Patch
from vllm_lookahead.glue.patches.speculative_config import METHOD, lookahead_params


def _owner():
    from vllm.v1.engine.input_processor import InputProcessor

    return InputProcessor


def _validate_params(original):
    def _validate_params(self, params, supported_tasks):
        result = original(self, params, supported_tasks)
        sc = self.speculative_config
        if sc is not None and sc.method == METHOD and hasattr(params, "extra_args"):
            from vllm.exceptions import VLLMValidationError

            try:
                request_params(lookahead_params(sc), params)
            except RequestSettingsError as e:
                raise VLLMValidationError(str(e), parameter=e.key) from None
        return result

    return _validate_params


PATCHES = [Patch("input_processor._validate_params", _owner, "_validate_params", _validate_params)]
