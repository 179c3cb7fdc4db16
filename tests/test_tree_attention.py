"""Tree attention on the paged CPU cache, against a dense reference built from the same K/V."""

from __future__ import annotations

import pytest
import torch

from vllm_lookahead.backends.base import TreeRows
from vllm_lookahead.backends.cpu.layouts import (
    check_layout,
    gather_kv,
    read_cache_slots,
    read_slots,
    split,
    torch_writer,
    vllm_writer,
    writer_runs,
)
from vllm_lookahead.backends.cpu.reference import apply_tree_attention
from vllm_lookahead.core.tree import build_step_tree


@pytest.mark.parametrize("isa, dtype", [("vec", torch.float32), ("vec", torch.bfloat16), ("amx", torch.bfloat16)])
@pytest.mark.parametrize("block_size", [32, 128])
def test_layout_check_passes_for_vllms_own_writer(isa, dtype, block_size):
    if not writer_runs(vllm_writer(isa), dtype, 64, block_size):
        pytest.skip(f"this host's vLLM build has no {isa} writer")
    check_layout(vllm_writer(isa), isa, dtype, num_kv_heads=3, head_size=64, block_size=block_size)


def test_layout_check_fails_loudly_on_a_layout_it_does_not_know():
    def plain_writer(k, v, kc, vc, slots):  # keys not transposed: not what the reader expects
        bs = kc.shape[2]
        kc[slots // bs, :, slots % bs] = k
        vc[slots // bs, :, slots % bs] = v

    with pytest.raises(RuntimeError, match="layout"):
        check_layout(plain_writer, "vec", torch.float32, num_kv_heads=2, head_size=64, block_size=32)


def writer(isa: str, dtype: torch.dtype, head_size: int, block_size: int):
    """vLLM's writer where this host's build has one for `isa`, else ours (byte for byte vLLM's: test_cpu_layouts)."""
    live = vllm_writer(isa)
    return live if writer_runs(live, dtype, head_size, block_size) else torch_writer(isa)


@pytest.mark.parametrize("isa, dtype", [("vec", torch.float32), ("amx", torch.bfloat16)])
def test_tree_attention_matches_dense_masked_attention(isa, dtype):
    torch.manual_seed(0)
    heads, kv_heads, d, bs = 6, 2, 64, 32
    prefix = 45
    tree = build_step_tree(7, None, [(1, 2, 3), (1, 4, 5), (6,)], merge=True)
    n = tree.num_nodes
    seq_len = prefix + n
    key = torch.randn(seq_len, kv_heads, d).to(dtype)
    value = torch.randn(seq_len, kv_heads, d).to(dtype)
    nb = 4
    kc, vc = split(torch.zeros(nb, kv_heads, bs, 2 * d, dtype=dtype))
    block_ids = torch.tensor([3, 1, 0, 2], dtype=torch.int32)
    pos = torch.arange(seq_len)
    slots = block_ids.long()[pos // bs] * bs + pos % bs
    writer(isa, dtype, d, bs)(key, value, kc, vc, slots)

    q_start = 5  # other requests' rows around it must stay untouched
    query = torch.randn(q_start + n + 3, heads, d).to(dtype)
    output = torch.full((q_start + n + 3, heads * d), 7.0, dtype=dtype)
    mask = tree.ancestor_mask()
    rows = TreeRows(req_index=1, q_start=q_start, num_nodes=n, seq_len=seq_len, block_ids=block_ids, mask=mask)
    apply_tree_attention(query, kc, vc, output, [rows], scale=0.125, isa=isa)

    assert torch.all(output[:q_start] == 7.0) and torch.all(output[q_start + n :] == 7.0)
    groups = heads // kv_heads
    # bfloat16: both round a float32 result once
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=4e-3)
    for u in range(n):
        visible = list(range(prefix)) + [prefix + v for v in range(n) if mask[u, v]]
        for h in range(heads):
            qv = query[q_start + u, h].float()
            k = key[visible, h // groups].float()
            w = torch.softmax((k @ qv) * 0.125, dim=0)
            ref = (w @ value[visible, h // groups].float()).to(dtype)
            got = output[q_start + u].view(heads, d)[h]
            torch.testing.assert_close(got, ref, **tol)
    k_all, v_all = gather_kv(kc, vc, block_ids, seq_len, isa)
    assert torch.equal(k_all, key.transpose(0, 1)) and torch.equal(v_all, value.transpose(0, 1))
    rk, rv = read_slots(kc, vc, block_ids, torch.tensor([prefix + 2, 0]), isa)
    assert torch.equal(rk, key[[prefix + 2, 0]]) and torch.equal(rv, value[[prefix + 2, 0]])
    picked = torch.tensor([prefix + 2, 0, bs + 1])
    rk, rv = read_cache_slots(kc, vc, slots[picked], isa)  # global slots, as the KV relocation reads them
    assert torch.equal(rk, key[picked]) and torch.equal(rv, value[picked])
