"""Which attention backend runs lookahead: trees where a tree backend reads the KV cache, chains everywhere else,
never a refusal; and the chain backend in the real engine (forced), exact in float32 with more than one token per
forward."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.conftest import make_llm
from vllm_lookahead.backends import CacheSpec, ChainBackend, select
from vllm_lookahead.backends.cpu.backend import CpuTreeBackend
from vllm_lookahead.devtools.prompts import as_chat, humaneval_prompts, sharegpt_prompts


def _spec(layout: str = "vec", dtype: torch.dtype = torch.float32, kv: str = "auto", platform: str = "cpu"):
    return CacheSpec(platform, layout, dtype, kv, head_size=64, block_size=128)


def test_trees_on_the_layouts_the_cpu_backend_reads():
    for layout, dtype in (
        ("vec", torch.float32),
        ("vec", torch.bfloat16),
        ("vec16", torch.float32),
        ("amx", torch.bfloat16),
    ):
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


def test_logit_rows_through_the_compiled_library_on_a_cpu_unless_switched_off():
    """Every backend on a CPU (the chain backend too) reads logits rows with the compiled library where it loads;
    without it (`compiled=False`, VLLM_LOOKAHEAD_TREE_KERNEL=0) and on other platforms, torch's path."""
    from vllm_lookahead.backends.cpu import library
    from vllm_lookahead.backends.cpu.logit_rows import CompiledRows
    from vllm_lookahead.backends.logit_rows import LogitRows

    loads = library.load() is not None
    for backend, _ in (select(_spec()), select(_spec(), force_chains="asked for"), select(_spec("neon"))):
        assert isinstance(backend.logit_rows, CompiledRows) == loads, backend
    assert isinstance(select(_spec())[0], CpuTreeBackend) and select(_spec())[0].library is library.load()
    for backend, _ in (
        select(_spec(), compiled=False),
        select(_spec(), force_chains="asked for", compiled=False),
        select(_spec("unknown", platform="xpu")),
    ):
        assert type(backend.logit_rows) is LogitRows, backend
    assert select(_spec(), compiled=False)[0].library is None


def test_forced_chains_and_the_chain_backend_never_attends_or_moves():
    backend, why = select(_spec(), force_chains="asked for")
    assert isinstance(backend, ChainBackend) and why.endswith("asked for")
    backend.relocate([], [], [])  # nothing to move: fine
    with pytest.raises(RuntimeError):
        backend.relocate([], [1], [0])
    with pytest.raises(RuntimeError):
        backend.attend()


@pytest.mark.engine
def test_chain_backend_in_the_engine_is_exact_with_more_than_one_token_per_forward(model_path, monkeypatch, caplog):
    """VLLM_LOOKAHEAD_BACKEND=chain: each request carries its best branch through vLLM's own attention."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    tok = AutoTokenizer.from_pretrained(model_path)
    prompts = humaneval_prompts(6) + [as_chat(tok, p) for p in sharegpt_prompts(4, max_chars=800)]
    params = SamplingParams(temperature=0.0, max_tokens=64)
    plain = make_llm(model_path, alone=True, max_num_seqs=4)
    want = [list(o.outputs[0].token_ids) for o in plain.generate(prompts, params, use_tqdm=False)]
    del plain
    monkeypatch.setenv("VLLM_LOOKAHEAD_BACKEND", "chain")
    caplog.set_level(logging.INFO, logger="vllm_lookahead")
    caplog.clear()
    llm = make_llm(
        model_path, alone=True, max_num_seqs=4, speculative_config={"method": "lookahead"}, disable_log_stats=False
    )
    said = [r.getMessage() for r in caplog.records if "lookahead runs" in r.getMessage()]  # the worker is here
    assert len(said) == 1 and "chains" in said[0] and "VLLM_LOOKAHEAD_BACKEND=chain" in said[0], said
    got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    stats = llm.collective_rpc("lookahead_stats")[0]
    assert stats["backend"] == "chain"
    assert stats["kernel_attention_steps"] == stats["reference_attention_steps"] == 0  # no tree rows ever
    generated = sum(map(len, got))
    assert generated / stats["steps"] > 1.2, stats  # more than one token per forward (prefill steps included)


# --- CUDA ---------------------------------------------------------------------------------------------------------


def test_cuda_trees_on_flash_attn_and_triton_attn_chains_elsewhere():
    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend

    for layout in ("auto", "FLASH_ATTN", "TRITON_ATTN"):
        backend, why = select(CacheSpec("cuda", layout, torch.bfloat16, "auto", 128, 16))
        assert isinstance(backend, CudaTreeBackend), why
    for spec in (
        CacheSpec("cuda", "FLASHINFER", torch.bfloat16, "auto", 128, 16),
        CacheSpec("cuda", "auto", torch.bfloat16, "fp8", 128, 16),
        CacheSpec("cuda", "auto", torch.float32, "auto", 128, 16),
        CacheSpec("cuda", "auto", torch.float16, "auto", 512, 16),
    ):
        backend, why = select(spec)
        assert isinstance(backend, ChainBackend) and why.startswith("chains"), spec


def _layer(kind: str, **impl_fields):
    from types import SimpleNamespace

    fields = dict(num_heads=4, num_kv_heads=2, head_size=64, sliding_window=None, alibi_slopes=None, sinks=None,
                  logits_soft_cap=None)  # fmt: skip
    impl = type(kind, (), {**fields, **impl_fields})()
    kv = torch.zeros(2, 4, 16, 128, dtype=torch.bfloat16)
    return SimpleNamespace(impl=impl, kv_cache=kv, layer_name="model.layers.0.attn")


def test_cuda_backend_checks_the_real_layers():
    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend

    backend = CudaTreeBackend()
    assert backend.check_layers([_layer("FlashAttentionImpl"), _layer("TritonAttentionImpl")]) is None
    for layer, said in (
        (_layer("FlashInferImpl"), "FlashInferImpl"),
        (_layer("FlashAttentionImpl", sliding_window=(127, 0)), "sliding window"),
        (_layer("FlashAttentionImpl", alibi_slopes=torch.ones(4)), "ALiBi"),
        (_layer("TritonAttentionImpl", sinks=torch.ones(4)), "sinks"),
        (_layer("TritonAttentionImpl", logits_soft_cap=30.0), "soft-capping"),
        (_layer("FlashAttentionImpl", kv_cache_dtype="fp8"), "fp8"),
    ):
        why = backend.check_layers([_layer("FlashAttentionImpl"), layer])
        assert why is not None and said in why, (said, why)


def test_cuda_relocation_layer_by_layer_where_the_caches_differ():
    """Caches of different strides (or shapes, dtypes) take the per-layer gather and scatter: K and V copied slot to
    slot in every layer, overlapping moves read before written, nothing else touched. (Alike caches take the two
    Triton launches: tests/test_cuda_tree_kernel.py.)"""
    from types import SimpleNamespace

    from vllm_lookahead.backends.cuda import relocation
    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend

    gen = torch.Generator().manual_seed(0)
    cells = [torch.randn(6, 16, 2, 64, generator=gen) for _ in range(3)]
    cells[1] = torch.randn(6, 2, 16, 64, generator=gen).transpose(1, 2)  # another layout: not alike
    layers = [SimpleNamespace(kv_cache=c.transpose(1, 2)) for c in cells]
    assert not relocation.cells_alike([layer.kv_cache for layer in layers])
    assert relocation.cells_alike([layers[0].kv_cache, layers[2].kv_cache])
    before = [c.clone() for c in cells]
    src, dst = [34, 35, 70], [35, 36, 17]  # 35 is read before 34 lands on it; and a move to another block
    CudaTreeBackend().relocate(layers, src, dst)
    for c, old in zip(cells, before, strict=True):
        want = old.reshape(6 * 16, 2, 64).clone()
        want[dst] = old.reshape(6 * 16, 2, 64)[src]
        assert torch.equal(c.reshape(6 * 16, 2, 64), want)
    CudaTreeBackend().relocate(layers, [], [])  # nothing to move


def test_cuda_patches_apply_only_on_cuda():
    from vllm_lookahead.glue import patches

    patches.apply_all()
    names = set(patches.applied())
    assert "cpu_attn.CPUAttentionBackendImpl.forward" in names
    assert not {n for n in names if n.startswith(("flash_attn.", "triton_attn."))}
