"""Which attention backend runs lookahead: trees where a tree backend reads the KV cache, chains everywhere else,
never a refusal; and the chain backend in the real engine (forced), exact in float32 with more than one token per
forward."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_llm
from vllm_lookahead.backends import CacheSpec, ChainBackend, select
from vllm_lookahead.backends.cpu.backend import CpuTreeBackend
from vllm_lookahead.tools.prompts import as_chat, humaneval_prompts, sharegpt_prompts


def _spec(layout: str = "vec", dtype: torch.dtype = torch.float32, kv: str = "auto", platform: str = "cpu"):
    return CacheSpec(platform, layout, dtype, kv, head_size=64, block_size=128)


def test_trees_on_the_layouts_the_cpu_backend_reads():
    for layout, dtype in (("vec", torch.float32), ("vec", torch.bfloat16), ("vec16", torch.float32)):
        backend, why = select(_spec(layout, dtype))
        assert isinstance(backend, CpuTreeBackend) and backend.trees, (layout, why)
        assert why.startswith("trees") and layout in why


@pytest.mark.parametrize(
    "spec",
    [
        _spec("neon"),
        _spec("rvv"),
        _spec("vxe"),
        _spec("vsx"),
        _spec("vec", kv="fp8"),
        _spec("vec", torch.float16),
        _spec("unknown", platform="xpu"),
    ],
    ids=["neon", "rvv", "vxe", "vsx", "fp8", "float16", "xpu"],
)
def test_chains_wherever_no_tree_backend_reads_the_cache(spec):
    backend, why = select(spec)
    assert isinstance(backend, ChainBackend) and not backend.trees
    assert why.startswith("chains") and len(why) > len("chains: ")  # says why


def test_forced_chains_and_the_chain_backend_never_attends_or_moves():
    backend, why = select(_spec(), force_chains="asked for")
    assert isinstance(backend, ChainBackend) and why.endswith("asked for")
    backend.relocate([], [], [])  # nothing to move: fine
    with pytest.raises(RuntimeError):
        backend.relocate([], [1], [0])
    with pytest.raises(RuntimeError):
        backend.attend()


@pytest.mark.engine
def test_chain_backend_in_the_engine_is_exact_with_more_than_one_token_per_forward(model_path, monkeypatch, capfd):
    """VLLM_LOOKAHEAD_BACKEND=chain: each request carries its best branch through vLLM's own attention."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    tok = AutoTokenizer.from_pretrained(model_path)
    prompts = humaneval_prompts(6) + [as_chat(tok, p) for p in sharegpt_prompts(4, max_chars=800)]
    params = SamplingParams(temperature=0.0, max_tokens=64)
    plain = make_llm(model_path, max_num_seqs=4)
    want = [list(o.outputs[0].token_ids) for o in plain.generate(prompts, params, use_tqdm=False)]
    del plain
    monkeypatch.setenv("VLLM_LOOKAHEAD_BACKEND", "chain")
    capfd.readouterr()
    llm = make_llm(model_path, max_num_seqs=4, speculative_config={"method": "lookahead"}, disable_log_stats=False)
    started = capfd.readouterr()
    said = [line for line in (started.out + started.err).splitlines() if "lookahead runs" in line]
    assert len(said) == 1 and "chains" in said[0] and "VLLM_LOOKAHEAD_BACKEND=chain" in said[0], said
    got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    stats = llm.collective_rpc("lookahead_stats")[0]
    assert stats["backend"] == "chain"
    assert stats["kernel_attention_steps"] == stats["reference_attention_steps"] == 0  # no tree rows ever
    generated = sum(map(len, got))
    assert generated / stats["steps"] > 1.2, stats  # more than one token per forward (prefill steps included)
