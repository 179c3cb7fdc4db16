"""vLLM 0.32's CPU KV-cache layouts (`layouts`): our readers and writer against caches vLLM's own writer made.

The fixtures in ../shared/fixtures/cpu-kv-layouts were written by vLLM's `cpu_attn_reshape_and_cache` on an AMX host
(every ISA, dtype, head size and block size there), so the amx layout is tested on hosts that cannot write it; where
this host's vLLM build has a writer for an ISA, ours is also compared with it live on fresh random data.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vllm_lookahead.backends.base import CacheSpec
from vllm_lookahead.backends.cpu import layouts
from vllm_lookahead.backends.cpu.layouts import (
    check_layout,
    gather_kv,
    read_cache_slots,
    read_slots,
    same_bytes,
    split,
    torch_writer,
    unsupported,
    vllm_writer,
    writer_runs,
)

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "cpu-kv-layouts"
FILES = sorted(FIXTURES.glob("*.pt"))
DTYPES = {"torch.bfloat16": torch.bfloat16, "torch.float32": torch.float32}


def load(path: Path) -> dict:
    return torch.load(path)


def live_writer(isa: str, dtype: torch.dtype, head_size: int, block_size: int):
    """vLLM's writer for `isa`, or None where this host's vLLM build has none (amx needs the AVX512-BF16 build)."""
    write = vllm_writer(isa)
    return write if writer_runs(write, dtype, head_size, block_size) else None


def test_every_fixture_is_there():
    kinds = {(d["isa"], d["dtype"], d["head_size"], d["block_size"]) for d in map(load, FILES)}
    for isa, dtypes in (("amx", ["torch.bfloat16"]), ("vec", list(DTYPES)), ("vec16", list(DTYPES))):
        for dtype in dtypes:
            for hs in (64, 128):
                for bs in (32, 128):
                    assert (isa, dtype, hs, bs) in kinds, f"missing fixture {isa} {dtype} hs{hs} bs{bs} in {FIXTURES}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_our_readers_read_back_what_vllm_wrote(path):
    f = load(path)
    isa, key, value, slots, bs = f["isa"], f["key"], f["value"], f["slot_mapping"], f["block_size"]
    kc, vc = split(f["kv_cache"])
    k, v = read_cache_slots(kc, vc, slots, isa)
    assert torch.equal(k, key) and torch.equal(v, value)
    # through a block table: the request's blocks in another order than the cache's
    block_ids = torch.randperm(f["num_blocks"], generator=torch.Generator().manual_seed(0)).to(torch.int32)
    position = torch.empty(f["num_blocks"] * bs, dtype=torch.long)  # cache slot -> the request's token position
    position[block_ids.long().repeat_interleave(bs) * bs + torch.arange(bs).repeat(f["num_blocks"])] = torch.arange(
        len(position)
    )
    pos = position[slots]
    k, v = read_slots(kc, vc, block_ids, pos, isa)
    assert torch.equal(k, key) and torch.equal(v, value)
    seq_len = int(pos.max()) + 1  # the last block partly read
    k_all, v_all = gather_kv(kc, vc, block_ids, seq_len, isa)
    assert k_all.shape == (f["num_kv_heads"], seq_len, f["head_size"])
    assert torch.equal(k_all[:, pos], key.transpose(0, 1)) and torch.equal(v_all[:, pos], value.transpose(0, 1))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_our_writer_reproduces_vllms_cache_byte_for_byte(path):
    f = load(path)
    ours = torch.zeros_like(f["kv_cache"])
    torch_writer(f["isa"])(f["key"], f["value"], *split(ours), f["slot_mapping"])
    assert same_bytes(ours, f["kv_cache"])


@pytest.mark.parametrize(
    "isa, dtype, head_size, block_size",
    [
        ("vec", torch.float32, 64, 32),
        ("vec", torch.bfloat16, 128, 128),
        ("vec", torch.bfloat16, 96, 16),
        ("vec16", torch.float32, 80, 16),
        ("vec16", torch.bfloat16, 112, 48),
        ("amx", torch.bfloat16, 64, 32),
        ("amx", torch.bfloat16, 128, 64),
        ("amx", torch.bfloat16, 256, 128),
        ("amx", torch.bfloat16, 96, 32),
    ],
)
def test_our_writer_equals_vllms_live_writer(isa, dtype, head_size, block_size):
    write = live_writer(isa, dtype, head_size, block_size)
    if write is None:
        pytest.skip(f"this host's vLLM build has no {isa} writer (the fixtures test it)")
    gen = torch.Generator().manual_seed(head_size + block_size)
    num_blocks, heads = 4, 3
    n = num_blocks * block_size * 3 // 4
    key = torch.randn(n, heads, head_size, generator=gen).to(dtype)
    value = torch.randn(n, heads, head_size, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:n]
    slots[5] = -1  # padding: both writers skip it
    theirs = torch.full((num_blocks, heads, block_size, 2 * head_size), float("nan"), dtype=dtype)
    ours = theirs.clone()
    write(key, value, *split(theirs), slots)
    torch_writer(isa)(key, value, *split(ours), slots)
    assert same_bytes(ours, theirs)
    check_layout(write, isa, dtype, heads, head_size, block_size)


@pytest.mark.parametrize("isa", ["vec", "amx"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_size, block_size", [(64, 32), (128, 128), (96, 64)])
def test_every_layout_places_each_element_once(isa, dtype, head_size, block_size):
    koff, voff = layouts.LAYOUTS[isa].offsets(block_size, head_size, dtype)
    everything = torch.arange(block_size * head_size)
    assert torch.equal(koff.flatten().sort().values, everything) and torch.equal(
        voff.flatten().sort().values, everything
    )


def test_amx_differs_from_vec_and_each_is_checked_against_its_own():
    check_layout(torch_writer("amx"), "amx", torch.bfloat16, 2, 64, 32)
    with pytest.raises(RuntimeError, match="layout"):
        check_layout(torch_writer("vec"), "amx", torch.bfloat16, 2, 64, 32)
    with pytest.raises(RuntimeError, match="layout"):
        check_layout(torch_writer("amx"), "vec", torch.bfloat16, 2, 64, 32)


def spec(layout: str, dtype=torch.bfloat16, kv_cache_dtype="auto", head_size=128, block_size=32) -> CacheSpec:
    return CacheSpec("cpu", layout, dtype, kv_cache_dtype, head_size, block_size)


@pytest.mark.parametrize("layout", ["vec", "vec16", "amx"])
def test_the_layouts_it_reads_are_supported(layout):
    assert unsupported(spec(layout)) is None
    if layout != "amx":
        assert unsupported(spec(layout, torch.float32, head_size=80, block_size=16)) is None


@pytest.mark.parametrize(
    "cache",
    [
        spec("neon"),
        spec("rvv"),
        spec("vxe"),
        spec("vsx"),
        spec("none (FP8 KV cache requires head_size divisible by 32 on CPU.)"),
        spec("vec", kv_cache_dtype="fp8"),
        spec("amx", kv_cache_dtype="fp8_e4m3"),
        spec("amx", torch.float32),  # vLLM picks amx for bfloat16 only
        spec("amx", head_size=80),  # vLLM picks vec16 there
        spec("vec", torch.float16),
    ],
    ids=str,
)
def test_what_it_does_not_read_runs_chains(cache):
    why = unsupported(cache)
    assert isinstance(why, str) and why


def test_start_up_checks_vllms_writer_where_it_runs_else_ours(monkeypatch):
    def wrong(k, v, kc, vc, slots):  # a vLLM whose amx writer lays keys out as vec does
        torch_writer("vec")(k, v, kc, vc, slots)

    monkeypatch.setattr(layouts, "vllm_writer", lambda isa, *a: wrong)
    assert "not the one" in unsupported(spec("amx"))

    def cannot(k, v, kc, vc, slots):  # a vLLM build without an amx writer (AVX2): vLLM never picks amx there
        raise RuntimeError("Unsupported CPU attention configuration")

    monkeypatch.setattr(layouts, "vllm_writer", lambda isa, *a: cannot)
    assert unsupported(spec("amx")) is None
