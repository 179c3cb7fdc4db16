"""Lookahead in vLLM's default, compiled mode (no `enforce_eager`): what `vllm serve` and `LLM(...)` run unless
told otherwise. On a CPU vLLM 0.32 traces the whole model once with dynamic shapes and compiles it with inductor,
attention included as its custom op, so the plugin's tree positions and tree attention must reach the compiled
graph through the same runtime hooks as in eager mode. Greedy float32 outputs must be a compiled plain engine's,
token for token (inductor's fusions may round differently from eager mode, so the baseline is compiled too).
"""

from __future__ import annotations

import pytest

from tests.conftest import make_llm
from vllm_lookahead.backends.cpu import library
from vllm_lookahead.devtools.prompts import as_chat, humaneval_prompts, sharegpt_prompts

pytestmark = pytest.mark.engine


def _batch(model_path: str):
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    tok = AutoTokenizer.from_pretrained(model_path)
    prompts = [*humaneval_prompts(6), *(as_chat(tok, p) for p in sharegpt_prompts(4, max_chars=1200))]
    params = [SamplingParams(temperature=0.0, max_tokens=(48, 80)[i % 2]) for i in range(len(prompts))]
    return prompts, params


def _generate(model_path: str, prompts, params, **kwargs):
    llm = make_llm(model_path, alone=True, enforce_eager=False, max_num_seqs=4, **kwargs)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        stats = llm.collective_rpc("lookahead_stats")[0] if "speculative_config" in kwargs else None
    finally:
        del llm
    return [list(o.outputs[0].token_ids) for o in outs], stats


def test_compiled_mode_greedy_identical_to_plain_decoding(model_path):
    prompts, params = _batch(model_path)
    plain, _ = _generate(model_path, prompts, params)
    got, stats = _generate(model_path, prompts, params, speculative_config={"method": "lookahead"})
    assert got == plain
    # trees were drafted, verified and accepted in the compiled forward pass: fewer steps than tokens
    tokens = sum(len(g) for g in got)
    assert stats["accepted"] > 0.2 * tokens
    assert stats["tree_steps"] > 0
    if library.load() is not None:
        assert stats["kernel_attention_steps"] > 0
