"""A vLLM 0.32 CPU bug in speculative sampling, fixed where lookahead samples.

`rejection_sampler.expand_batch_to_tokens` spreads each request's temperature, top-k and top-p over its draft
rows. On CPU its kernel (`cpu_triton_utils._expand_kernel_impl`) converts the output and input tensors to int64
before the C++ op writes, so for float32 temperatures and top-p, and int32 top-k, the op writes into a temporary
copy: the returned tensor keeps `new_empty`'s uninitialised memory (and a float input would be truncated to an
integer anyway). vLLM's rejection sampler then divides by garbage temperatures, and top-k fails ("selected index k
out of range") or truncates at random. Every speculative method's sampled requests are affected on CPU.

The replacement expands with `repeat_interleave`. It is active while lookahead samples (`patches/model_runner.py`
opens `sampling_scope` around `engine.sample`), and for every method where the settings say so when the patch is
applied (`settings.py`: benchmarks comparing vLLM's own sampled ngram/suffix runs use it); otherwise vLLM's own
function runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from vllm_lookahead.glue.patches.base import Patch
from vllm_lookahead.glue.settings import Settings

_active: ContextVar[bool] = ContextVar("lookahead_cpu_sampling_fix", default=False)


@contextmanager
def sampling_scope() -> Iterator[None]:
    token = _active.set(True)
    try:
        yield
    finally:
        _active.reset(token)


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    """[batch] -> [num_tokens]: x[i] repeated for request i's rows, replace_from replaced by replace_to."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    out = torch.repeat_interleave(x, counts, output_size=num_tokens)
    if replace_from != replace_to:
        out = out.masked_fill(out == replace_from, replace_to)
    return out


def _owner():
    from vllm.v1.sample import rejection_sampler

    return rejection_sampler


def _expand(original):
    always = Settings.from_env().fix_cpu_sampling

    def expand(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        if x.device.type == "cpu" and (always or _active.get()):
            return expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from, replace_to)
        return original(x, cu_num_tokens, num_tokens, replace_from, replace_to)

    return expand


PATCHES = [Patch("rejection_sampler.expand_batch_to_tokens", _owner, "expand_batch_to_tokens", _expand)]
