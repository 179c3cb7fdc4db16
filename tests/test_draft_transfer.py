"""patches/draft_transfer.py: a lookahead engine's drafts reach the scheduler with the step's model output, without
vLLM's extra call to the worker per step; other engines keep vLLM's own path."""

from __future__ import annotations

import pytest
from vllm import SamplingParams

from tests.conftest import make_llm

pytestmark = pytest.mark.engine

PROMPT = "Repeat: one two three four five, one two three four five, one two three four five, one two"


@pytest.fixture
def draft_calls(monkeypatch):
    """Calls of the engine core's fetch of the drafts from the worker (`_llm`: the worker in this process)."""
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    calls = []
    real = UniProcExecutor.take_draft_token_ids

    def counted(self):  # noqa: ANN001, ANN202
        calls.append(1)
        return real(self)

    monkeypatch.setattr(UniProcExecutor, "take_draft_token_ids", counted)
    return calls


def _llm(model_path: str, spec: dict):
    return make_llm(model_path, speculative_config=spec, distributed_executor_backend="uni")


def _generate(llm) -> list[int]:
    out = llm.generate([PROMPT, PROMPT + " three"], SamplingParams(temperature=0.0, max_tokens=48), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in out]


def test_lookahead_drafts_come_with_the_model_output(model_path, draft_calls):
    llm = _llm(model_path, {"method": "lookahead"})
    try:
        _generate(llm)
        stats = llm.collective_rpc("lookahead_stats")[0]
    finally:
        del llm
    assert stats["accepted"] > 0  # the drafts reached the scheduler and were verified
    assert draft_calls == []


def test_other_methods_keep_vllms_fetch(model_path, draft_calls):
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    llm = _llm(model_path, spec)
    try:
        _generate(llm)
    finally:
        del llm
    assert len(draft_calls) > 0
