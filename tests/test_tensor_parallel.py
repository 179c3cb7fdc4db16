"""Lookahead under tensor parallelism on vLLM's multiprocessing executor (two ranks on this CPU), and the
parallel set-ups vLLM 0.32's CPU platform cannot run, refused at start-up.

The default model has 9 attention heads, which two ranks cannot split: these tests use the registered
qwen2.5-coder-0.5b-instruct (14 heads, 2 KV heads), which `make test` prepares. Lookahead runs with its default
settings, so each rank sizes trees from its own step timings: only the driver's drafts are scheduled, and every
rank must still verify the same trees.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import make_llm
from vllm_lookahead.devtools.prompts import as_chat, humaneval_prompts, sharegpt_prompts

pytestmark = pytest.mark.engine

TP_MODEL = "qwen2.5-coder-0.5b-instruct"
TP = 2
# Counters every rank must agree on: each verifies the same trees and accepts the same tokens.
SHARED_COUNTERS = ("steps", "tree_steps", "accepted", "sampled_accepted", "fallback_requests", "drafted_", "accepted_")


@pytest.fixture(scope="module")
def tp_model_path() -> str:
    from vllm_lookahead.devtools.models import prepare

    return str(prepare(TP_MODEL))


@pytest.fixture(scope="module", autouse=True)
def _worker_env():
    """vLLM binds each rank's OpenMP threads to its own CPU list ('|' between ranks): the machine's cores, split."""
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // TP)
    lists = [cores[i * per : (i + 1) * per] or cores[-1:] for i in range(TP)]
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_OMP_THREADS_BIND", "|".join(",".join(map(str, c)) for c in lists))
    mp.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a test function
    yield
    mp.undo()


@pytest.fixture(scope="module")
def batch(tp_model_path):
    """Code and chat prompts, greedy, with one opted-out request, one seeded sampled request and one with its own
    lookahead settings."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    tok = AutoTokenizer.from_pretrained(tp_model_path)
    prompts = [*humaneval_prompts(6), *(as_chat(tok, p) for p in sharegpt_prompts(3, max_chars=800))]
    params = [SamplingParams(temperature=0.0, max_tokens=(32, 48)[i % 2]) for i in range(len(prompts))]
    prompts += humaneval_prompts(9)[6:]
    params += [
        SamplingParams(temperature=0.0, max_tokens=32, extra_args={"lookahead": False}),
        SamplingParams(temperature=0.8, seed=4, max_tokens=32, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=32, extra_args={"lookahead": {"window_size": 1, "ngram_size": 2}}),
    ]
    return prompts, params


def _skew_tree_sizes(worker) -> int:
    """Run on every worker: rank 0 finds every node worth its cost, the others none, so their own tree sizes
    differ as much as they can (in real runs they differ by their step timings)."""
    from vllm_lookahead.core.cost import StepCost
    from vllm_lookahead.glue.patches.model_runner import engine_of

    drafting = engine_of(worker.model_runner).drafting
    assert isinstance(drafting.cost, StepCost)  # the price the sizing reads
    drafting.cost = StepCost(0.0 if worker.rank == 0 else 10.0)
    return worker.rank


def _outputs(llm, batch) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(*batch, use_tqdm=False)]


def test_tensor_parallel_outputs_are_plain_decodings(tp_model_path, batch):
    plain = make_llm(tp_model_path, tensor_parallel_size=TP, max_num_seqs=8)
    try:
        want = _outputs(plain, batch)
    finally:
        del plain
    la = make_llm(tp_model_path, tensor_parallel_size=TP, max_num_seqs=8, speculative_config={"method": "lookahead"})
    try:
        assert sorted(la.collective_rpc(_skew_tree_sizes)) == list(range(TP))
        got = _outputs(la, batch)
        stats = la.collective_rpc("lookahead_stats")
    finally:
        del la
    assert [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b] == []
    assert len(stats) == TP
    shared = [{k: v for k, v in s.items() if k.startswith(SHARED_COUNTERS)} for s in stats]
    differ = [{k: (v, s[k]) for k, v in shared[0].items() if s[k] != v} for s in shared]
    assert all(s == shared[0] for s in shared), differ
    assert shared[0]["accepted"] > 0 and shared[0]["fallback_requests"] == 1


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"pipeline_parallel_size": 2}, r"lookahead: pipeline_parallel_size must be 1 \(got 2\)"),
        (
            {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
            r"lookahead: distributed_executor_backend 'ray' cannot run here",
        ),
    ],
)
def test_unsupported_parallelism_is_refused_at_start(tp_model_path, kw, message):
    with pytest.raises(Exception, match=message):
        make_llm(tp_model_path, speculative_config={"method": "lookahead"}, **kw)
