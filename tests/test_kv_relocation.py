"""Moving accepted nodes' KV: the compiled one-call move against the per-layer reference (torch reads and vLLM's
own cache writer), on real caches of several layers."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.backends.cpu import kernel as tree_kernel
from vllm_lookahead.backends.cpu import relocation as kv_relocation

pytestmark = pytest.mark.skipif(tree_kernel.load() is None, reason="no C++ compiler: the reference path runs")

LAYERS, KV_HEADS, HEAD_SIZE = 3, 2, 64


def layers(dtype, block_size, num_blocks, seed):
    gen = torch.Generator().manual_seed(seed)
    return [
        SimpleNamespace(
            kv_cache=torch.randn(num_blocks, KV_HEADS, block_size, 2 * HEAD_SIZE, generator=gen).to(dtype),
            isa="vec",
            impl=SimpleNamespace(kv_cache_dtype="auto"),
            _k_scale_float=1.0,
            _v_scale_float=1.0,
        )
        for _ in range(LAYERS)
    ]


def moves(rng, num_slots, m):
    """Accepted paths' moves as the engine makes them: node slots after a prefix to the consecutive slots after
    it, so sources and destinations overlap."""
    start = rng.randrange(num_slots - 2 * m)
    nodes = sorted(rng.sample(range(1, 2 * m), m))
    return [start + u for u in nodes], [start + d for d in range(1, m + 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@settings(max_examples=30, deadline=None)
@given(block_size=st.sampled_from([16, 32, 128]), m=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_the_compiled_move_matches_the_reference(dtype, block_size, m, seed):
    rng = random.Random(seed)
    num_blocks = 6
    src, dst = moves(rng, num_blocks * block_size, m)
    fast, ref = layers(dtype, block_size, num_blocks, seed), layers(dtype, block_size, num_blocks, seed)
    before = [layer.kv_cache.clone() for layer in fast]
    found = kv_relocation.CacheLayers.of(fast)
    assert found.compiled
    kv_relocation.move_kv_slots(found, src, dst)
    kv_relocation.move_kv_slots_reference(ref, src, dst)
    for f, r, b in zip(fast, ref, before, strict=True):
        assert torch.equal(f.kv_cache, r.kv_cache)
        if src != dst:
            assert not torch.equal(f.kv_cache, b), "nothing moved"


def test_what_the_kernel_does_not_copy_goes_to_the_reference(monkeypatch):
    scaled = layers(torch.float32, 16, 4, 0)
    for layer in scaled:
        layer.impl.kv_cache_dtype = "fp8"
    assert not kv_relocation.compiled_moves_apply(scaled[0])
    other = layers(torch.float32, 16, 4, 0)
    other[1].isa = "amx"
    assert not kv_relocation.compiled_moves_apply(other[1])
    assert not kv_relocation.CacheLayers.of(other).compiled
    mixed = layers(torch.float32, 16, 4, 0) + layers(torch.bfloat16, 16, 4, 0)
    assert not kv_relocation.CacheLayers.of(mixed).compiled, "one call needs one cache shape, dtype and strides"
    called = []
    monkeypatch.setattr(kv_relocation, "move_kv_slots_reference", lambda *a: called.append(a))
    kv_relocation.move_kv_slots(kv_relocation.CacheLayers.of(other), [3], [1])
    assert called, "a layer the kernel cannot copy must send the step's moves to the reference"


def test_moves_outside_the_cache_are_refused():
    ls = layers(torch.float32, 16, 2, 0)
    with pytest.raises(ValueError):
        tree_kernel.load().move_slots([layer.kv_cache for layer in ls], [40], [1])
