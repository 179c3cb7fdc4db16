"""Moving accepted nodes' KV: the compiled one-call move against the per-layer reference (torch reads and vLLM's
own cache writer), on real caches of several layers, in the vec and the amx layout; and both against the moves
applied to the K/V before they were written."""

from __future__ import annotations

import contextlib
import random
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.backends.cpu import layouts, library
from vllm_lookahead.backends.cpu import relocation as kv_relocation

pytestmark = pytest.mark.skipif(library.load() is None, reason="no C++ compiler: the reference path runs")

LAYERS, KV_HEADS, HEAD_SIZE = 3, 2, 64


CASES = [("vec", torch.float32), ("vec", torch.bfloat16), ("amx", torch.bfloat16)]


def layers(dtype, block_size, num_blocks, seed, isa="vec"):
    gen = torch.Generator().manual_seed(seed)
    return [
        SimpleNamespace(
            kv_cache=torch.randn(num_blocks, KV_HEADS, block_size, 2 * HEAD_SIZE, generator=gen).to(dtype),
            isa=isa,
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


def vllms_writer_or_ours(isa):
    """The reference path writes with vLLM's writer; where this host's vLLM build has none for `isa` (amx on an
    AVX2 host), with ours, byte for byte the same (test_cpu_layouts)."""
    if layouts.writer_runs(layouts.vllm_writer(isa), torch.bfloat16, HEAD_SIZE, 32):
        return contextlib.nullcontext()
    return mock.patch.object(layouts, "layer_writer", lambda layer: layouts.torch_writer(layer.isa))


@pytest.mark.parametrize("isa, dtype", CASES)
@settings(max_examples=30, deadline=None)
@given(block_size=st.sampled_from([16, 32, 128]), m=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_the_compiled_move_matches_the_reference(isa, dtype, block_size, m, seed):
    if isa == "amx" and block_size % 32:
        block_size = 64  # vLLM's amx needs whole 32-token blocks
    rng = random.Random(seed)
    num_blocks = 6
    src, dst = moves(rng, num_blocks * block_size, m)
    fast, ref = layers(dtype, block_size, num_blocks, seed, isa), layers(dtype, block_size, num_blocks, seed, isa)
    before = [layer.kv_cache.clone() for layer in fast]
    found = kv_relocation.CacheLayers.of(fast, library.load())
    assert found.compiled and found.layout == layouts.LAYOUTS[isa].kernel_code
    kv_relocation.move_kv_slots(found, src, dst)
    with vllms_writer_or_ours(isa):
        kv_relocation.move_kv_slots_reference(ref, src, dst)
    for f, r, b in zip(fast, ref, before, strict=True):
        assert torch.equal(f.kv_cache, r.kv_cache)
        if src != dst:
            assert not torch.equal(f.kv_cache, b), "nothing moved"


@pytest.mark.parametrize("isa, dtype", CASES)
@pytest.mark.parametrize("compiled", [True, False])
def test_exactly_the_moved_entries_change(isa, dtype, compiled):
    """Every slot's K/V written first; after the moves the cache must be byte for byte what writing the moved K/V
    gives: the destinations hold their sources' K/V, nothing else changed (every element of a block belongs to
    some slot in both layouts)."""
    block_size, num_blocks = 32, 5
    slots = torch.arange(num_blocks * block_size)
    gen = torch.Generator().manual_seed(7)
    kv = [torch.randn(len(slots), KV_HEADS, HEAD_SIZE, generator=gen).to(dtype) for _ in range(2 * LAYERS)]
    ls = layers(dtype, block_size, num_blocks, 0, isa)
    for i, layer in enumerate(ls):
        layouts.torch_writer(isa)(kv[2 * i], kv[2 * i + 1], *layouts.split(layer.kv_cache), slots)
    src, dst = [40, 43, 44, 70], [39, 40, 41, 42]  # overlapping, across a block boundary (slot 64)
    if compiled:
        found = kv_relocation.CacheLayers.of(ls, library.load())
        assert found.compiled
        kv_relocation.move_kv_slots(found, src, dst)
    else:
        with vllms_writer_or_ours(isa):
            kv_relocation.move_kv_slots_reference(ls, src, dst)
    for i, layer in enumerate(ls):
        k, v = kv[2 * i].clone(), kv[2 * i + 1].clone()
        k[dst], v[dst] = kv[2 * i][src], kv[2 * i + 1][src]
        want = torch.zeros_like(layer.kv_cache)
        layouts.torch_writer(isa)(k, v, *layouts.split(want), slots)
        assert layouts.same_bytes(layer.kv_cache, want)


def test_what_the_kernel_does_not_copy_goes_to_the_reference(monkeypatch):
    lib = library.load()
    scaled = layers(torch.float32, 16, 4, 0)
    for layer in scaled:
        layer.impl.kv_cache_dtype = "fp8"
    assert not kv_relocation.compiled_moves_apply(scaled[0])
    other = layers(torch.float32, 16, 4, 0)
    other[1].isa = "neon"
    assert not kv_relocation.compiled_moves_apply(other[1])
    assert not kv_relocation.CacheLayers.of(other, lib).compiled
    assert not kv_relocation.CacheLayers.of(layers(torch.float32, 16, 4, 0), None).compiled  # no library: no call
    amx_float32 = layers(torch.float32, 32, 4, 0, "amx")  # vLLM's amx holds bfloat16 only
    assert not kv_relocation.compiled_moves_apply(amx_float32[0])
    mixed = layers(torch.float32, 16, 4, 0) + layers(torch.bfloat16, 16, 4, 0)
    assert not kv_relocation.CacheLayers.of(mixed, lib).compiled, "one call needs one cache shape, dtype and strides"
    two_layouts = layers(torch.bfloat16, 32, 4, 0) + layers(torch.bfloat16, 32, 4, 0, "amx")
    assert not kv_relocation.CacheLayers.of(two_layouts, lib).compiled, "one call moves one layout"
    called = []
    monkeypatch.setattr(kv_relocation, "move_kv_slots_reference", lambda *a: called.append(a))
    kv_relocation.move_kv_slots(kv_relocation.CacheLayers.of(other, lib), [3], [1])
    assert called, "a layer the kernel cannot copy must send the step's moves to the reference"


def test_moves_outside_the_cache_are_refused():
    ls = layers(torch.float32, 16, 2, 0)
    with pytest.raises(ValueError):
        library.load().move_slots([layer.kv_cache for layer in ls], [40], [1], 0)
