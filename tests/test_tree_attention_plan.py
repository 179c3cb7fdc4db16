"""The compiled tree-attention path against the reference: vLLM's stock kernel over every row, then the tree rows
recomputed by the plain-torch `apply_tree_attention`, on vLLM's real paged CPU cache and kernels."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_lookahead.backends.base import TreeRows
from vllm_lookahead.backends.cpu import kernel, library
from vllm_lookahead.backends.cpu.layouts import split, torch_writer, vllm_writer, writer_runs
from vllm_lookahead.backends.cpu.plan import (
    PLAIN_ROWS_IN_KERNEL,
    TreeAttentionPlan,
    _causal_rows,
    ancestor_bitsets,
    supports,
)
from vllm_lookahead.backends.cpu.reference import apply_tree_attention, tree_attention

pytestmark = pytest.mark.skipif(library.load() is None, reason="no C++ compiler: the plain-torch path runs")

HEADS, KV_HEADS, HEAD_SIZE = 6, 2, 64
PAD_ROWS = 3  # rows past num_actual_tokens (padding) must stay untouched


def random_mask(n: int, rng: random.Random) -> torch.Tensor:
    parents = [-1] + [rng.randrange(u) for u in range(1, n)]
    mask = torch.eye(n, dtype=torch.bool)
    for u in range(1, n):
        mask[u] |= mask[parents[u]]
    return mask


def make_step(reqs, dtype, block_size, seed, isa="vec", raw=None, fill=0.0):
    """reqs: (kind, cached prefix, query rows) with kind 'tree' or 'plain' (causal rows: decode or prefill).

    Returns the fake impl/layer/metadata, the query (a strided view, as vLLM's qkv split makes it), the cache and
    the trees, with every request's K/V written into shuffled blocks of a cache in `isa`'s layout (by vLLM's own
    writer where this host's build has one, else by ours, byte for byte the same: test_cpu_layouts); the rest of
    the cache holds `fill`. raw: a list that receives each request's K/V as written ([seq_len, KV heads, D])."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [p + q for _, p, q in reqs]
    nblk = [-(-s // block_size) for s in seq_lens]
    perm = list(range(sum(nblk) + 2))
    rng.shuffle(perm)
    block_table = torch.zeros(len(reqs), max(nblk) + 1, dtype=torch.int32)
    used = 0
    for i, nb in enumerate(nblk):
        block_table[i, :nb] = torch.tensor(perm[used : used + nb], dtype=torch.int32)
        used += nb
    kv_cache = torch.full((len(perm), KV_HEADS, block_size, 2 * HEAD_SIZE), fill, dtype=dtype)
    write = vllm_writer(isa)
    if not writer_runs(write, dtype, HEAD_SIZE, block_size):
        write = torch_writer(isa)
    key_cache, value_cache = split(kv_cache)
    qsl = [0]
    for _, _, q in reqs:
        qsl.append(qsl[-1] + q)
    num_tokens = qsl[-1]
    qkv = torch.randn(num_tokens + PAD_ROWS, (HEADS + 2 * KV_HEADS) * HEAD_SIZE, generator=gen).to(dtype)
    query = qkv[:, : HEADS * HEAD_SIZE].view(-1, HEADS, HEAD_SIZE)
    trees = []
    for i, (kind, p, q) in enumerate(reqs):
        s = p + q
        k = torch.randn(s, KV_HEADS, HEAD_SIZE, generator=gen).to(dtype)
        v = torch.randn(s, KV_HEADS, HEAD_SIZE, generator=gen).to(dtype)
        t = torch.arange(s)
        slots = block_table[i].long()[t // block_size] * block_size + t % block_size
        write(k, v, key_cache, value_cache, slots)
        if raw is not None:
            raw.append((k, v))
        if kind == "tree":
            trees.append(TreeRows(i, qsl[i], q, s, block_table[i], random_mask(q, rng)))
    impl = SimpleNamespace(
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_size=HEAD_SIZE,
        scale=HEAD_SIZE**-0.5,
        kv_cache_dtype="auto",
        alibi_slopes=None,
        logits_soft_cap=0,
        sinks=None,
        sliding_window=-1,
    )
    layer = SimpleNamespace(isa=isa, _k_scale_float=1.0, _v_scale_float=1.0)
    md = SimpleNamespace(
        causal=True,
        dynamic_causal=None,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=block_table,
        num_actual_tokens=num_tokens,
    )
    return impl, layer, md, query, kv_cache, trees


def reference(impl, layer, md, query, kv_cache, trees) -> torch.Tensor:
    """What the plain-torch path computes: the stock kernel on every row, the tree rows recomputed."""
    from vllm import _custom_ops as ops

    n = md.num_actual_tokens
    key_cache, value_cache = split(kv_cache)
    output = torch.full((query.shape[0], HEADS * HEAD_SIZE), 7.0, dtype=query.dtype)
    sched = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(md.seq_lens), num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_SIZE,
        seq_lens=md.seq_lens, dtype=query.dtype, query_start_loc=md.query_start_loc, causal=True,
        sliding_window_size=-1, isa="vec", enable_kv_split=True, dynamic_causal=None, kv_cache_dtype="auto",
    )  # fmt: skip
    ops.cpu_attention_with_kv_cache(
        query[:n], key_cache, value_cache, output[:n].view(n, HEADS, HEAD_SIZE), md.query_start_loc, md.seq_lens,
        impl.scale, True, None, -1, md.block_table, 0.0, sched, None,
    )  # fmt: skip
    apply_tree_attention(query, key_cache, value_cache, output, trees, impl.scale)
    return output


def fast(impl, layer, md, query, kv_cache, trees) -> torch.Tensor:
    plan = TreeAttentionPlan.build(library.load(), trees, impl, layer, query, kv_cache, md)
    assert plan is not None
    output = torch.full((query.shape[0], HEADS * HEAD_SIZE), 7.0, dtype=query.dtype)
    plan.forward(layer, impl, query, kv_cache, output)
    return output


def tolerance(dtype):
    # float32: both exact up to summation order; bfloat16: both round an fp32 result once (one ulp apart at most)
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=4e-3)


request = st.one_of(
    st.tuples(st.just("tree"), st.integers(0, 300), st.integers(2, 70)),
    st.tuples(st.just("plain"), st.integers(1, 300), st.just(1)),  # decode
    st.tuples(st.just("plain"), st.integers(0, 100), st.integers(2, 40)),  # prefill / chunked prefill
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(request, min_size=1, max_size=6).filter(lambda rs: any(k == "tree" for k, _, _ in rs)),
    block_size=st.sampled_from([32, 128]),
    seed=st.integers(0, 2**16),
)
def test_fast_path_matches_the_reference(dtype, reqs, block_size, seed):
    step = make_step(reqs, dtype, block_size, seed)
    want = reference(*step)
    got = fast(*step)
    assert torch.all(got[-PAD_ROWS:] == 7.0), "padding rows past num_actual_tokens were written"
    torch.testing.assert_close(got, want, **tolerance(dtype))


tree_only = st.tuples(st.just("tree"), st.integers(0, 300), st.integers(1, 70))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(tree_only, min_size=1, max_size=4),
    block_size=st.sampled_from([32, 64, 128]),
    seed=st.integers(0, 2**16),
)
def test_the_kernel_and_the_reference_read_the_amx_layout(reqs, block_size, seed):
    """bfloat16 in vLLM's amx layout (trees only: vLLM's stock amx kernel needs AMX tiles), against attention over
    the K/V as written (not read back from the cache); the memory around them is NaN, as stale memory may be."""
    raw = []
    step = make_step(reqs, torch.bfloat16, block_size, seed, isa="amx", raw=raw, fill=float("nan"))
    impl, layer, md, query, kv_cache, trees = step
    want = torch.full((query.shape[0], HEADS * HEAD_SIZE), 7.0, dtype=query.dtype)
    out3 = want.view(-1, HEADS, HEAD_SIZE)
    for t, (k, v) in zip(trees, raw, strict=True):
        rows = slice(t.q_start, t.q_start + t.num_nodes)
        out3[rows] = tree_attention(query[rows], k.transpose(0, 1), v.transpose(0, 1), t.mask, impl.scale)
    got = fast(*step)
    assert torch.all(got[-PAD_ROWS:] == 7.0), "padding rows past num_actual_tokens were written"
    torch.testing.assert_close(got, want, **tolerance(torch.bfloat16))
    ref = torch.full_like(want, 7.0)
    apply_tree_attention(query, *split(kv_cache), ref, trees, impl.scale, "amx")
    torch.testing.assert_close(ref, want, **tolerance(torch.bfloat16))


def test_amx_items_both_widened_and_read_in_place(monkeypatch):
    """One tree of 2 nodes (6 rows: keys read in place) and one of 40 (items of 13-14 nodes, 39-42 rows: widened
    first), odd and even sequence lengths (a value pair's other token past seq_len)."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # so many threads would not cut the tree finer
    raw = []
    step = make_step([("tree", 37, 2), ("tree", 90, 40)], torch.bfloat16, 32, 5, isa="amx", raw=raw, fill=float("nan"))
    impl, layer, md, query, kv_cache, trees = step
    got = fast(*step).view(-1, HEADS, HEAD_SIZE)
    for t, (k, v) in zip(trees, raw, strict=True):
        rows = slice(t.q_start, t.q_start + t.num_nodes)
        want = tree_attention(query[rows], k.transpose(0, 1), v.transpose(0, 1), t.mask, impl.scale)
        torch.testing.assert_close(got[rows], want, **tolerance(torch.bfloat16))


def test_one_plan_serves_every_layer_of_the_step():
    """Strides are taken once; later layers bring other query data and other caches of the same shape."""
    reqs = [("plain", 40, 1), ("tree", 150, 24), ("tree", 31, 9), ("plain", 0, 5)]
    impl, layer, md, query, kv_cache, trees = make_step(reqs, torch.float32, 32, seed=1)
    plan = TreeAttentionPlan.build(library.load(), trees, impl, layer, query, kv_cache, md)
    for layer_seed in (2, 3):
        _, _, _, q2, kv2, _ = make_step(reqs, torch.float32, 32, seed=layer_seed)
        out = torch.full((q2.shape[0], HEADS * HEAD_SIZE), 7.0)
        plan.forward(layer, impl, q2, kv2, out)
        torch.testing.assert_close(out, reference(impl, layer, md, q2, kv2, trees), rtol=1e-5, atol=1e-5)


def test_a_batch_of_trees_only_skips_the_stock_kernel():
    step = make_step([("tree", 100, 16), ("tree", 0, 3)], torch.float32, 128, seed=4)
    impl, layer, md, query, kv_cache, trees = step
    plan = TreeAttentionPlan.build(library.load(), trees, impl, layer, query, kv_cache, md)
    assert plan is not None and plan.plain is None
    torch.testing.assert_close(fast(*step), reference(*step), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "change",
    [
        {"alibi_slopes": torch.ones(HEADS)},
        {"logits_soft_cap": 30.0},
        {"sinks": torch.zeros(HEADS)},
        {"sliding_window": 64},
        {"kv_cache_dtype": "fp8"},
        {"head_size": 48},
    ],
)
def test_what_the_kernel_does_not_do_goes_to_the_reference_path(change):
    impl, layer, md, query, kv_cache, trees = make_step([("tree", 10, 4)], torch.float32, 32, seed=0)
    assert supports(library.load(), impl, layer, query, kv_cache)
    for key, value in change.items():
        setattr(impl, key, value)
    assert not supports(library.load(), impl, layer, query, kv_cache)
    assert TreeAttentionPlan.build(library.load(), trees, impl, layer, query, kv_cache, md) is None


def test_other_cache_layouts_and_dtypes_go_to_the_reference_path():
    impl, layer, md, query, kv_cache, trees = make_step([("tree", 10, 4)], torch.float32, 32, seed=0)
    for isa in ("neon", "rvv", "vxe", "vsx"):
        assert not supports(library.load(), impl, SimpleNamespace(isa=isa), query, kv_cache)
    assert not supports(library.load(), impl, SimpleNamespace(isa="amx"), query, kv_cache), "amx holds bfloat16 only"
    assert supports(library.load(), impl, SimpleNamespace(isa="amx"), query.bfloat16(), kv_cache.bfloat16())
    assert not supports(library.load(), impl, layer, query.half(), kv_cache.half())
    md.causal = False
    assert TreeAttentionPlan.build(library.load(), trees, impl, layer, query, kv_cache, md) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_plain_requests_join_the_kernel_and_prompts_stay_on_the_stock_kernel(dtype):
    """Decoding rows and a short chain beside a tree are computed by the compiled kernel (as causal trees); a prompt
    longer than PLAIN_ROWS_IN_KERNEL stays on vLLM's stock kernel, alone."""
    prompt = PLAIN_ROWS_IN_KERNEL + 1
    reqs = [("plain", 40, 1), ("tree", 150, 9), ("plain", 30, 5), ("plain", 0, prompt), ("plain", 7, 1)]
    step = make_step(reqs, dtype, 32, seed=6)
    impl, layer, md, query, kv_cache, trees = step
    plan = TreeAttentionPlan.build(library.load(), trees, impl, layer, query, kv_cache, md)
    assert plan is not None and plan.plain is not None
    first = 1 + 9 + 5
    assert plan.plain.rows.tolist() == list(range(first, first + prompt))
    assert sorted(set(plan.keep[0][:, 7].tolist())) == [0, 1, 2, 4]  # the kernel's work items' requests
    torch.testing.assert_close(fast(*step), reference(*step), **tolerance(dtype))
    # decoding rows alone beside the tree: no stock kernel call at all
    step = make_step([("plain", 40, 1), ("tree", 150, 9), ("plain", 3, 1)], dtype, 32, seed=7)
    impl, layer, md, query, kv_cache, trees = step
    plan = TreeAttentionPlan.build(library.load(), trees, impl, layer, query, kv_cache, md)
    assert plan is not None and plan.plain is None
    torch.testing.assert_close(fast(*step), reference(*step), **tolerance(dtype))


def test_plain_rows_stay_on_the_stock_kernel_where_the_layout_says_so():
    """vLLM's AMX-tile kernel was not measured against the compiled one: there plain rows are not taken."""
    impl, layer, md, query, kv_cache, trees = make_step([("plain", 40, 1), ("tree", 10, 4)], torch.bfloat16, 32, 0)
    qsl, seq = md.query_start_loc.numpy(), md.seq_lens.numpy()
    assert [r.req_index for r in _causal_rows(trees, layer, qsl, seq, md.num_actual_tokens)] == [0]
    assert _causal_rows(trees, SimpleNamespace(isa="amx"), qsl, seq, md.num_actual_tokens) == []


def test_a_tree_that_does_not_match_the_metadata_is_an_error():
    impl, layer, md, query, kv_cache, trees = make_step([("plain", 5, 1), ("tree", 10, 4)], torch.float32, 32, 0)
    wrong = [TreeRows(1, trees[0].q_start, 4, trees[0].seq_len + 1, trees[0].block_ids, trees[0].mask)]
    with pytest.raises(RuntimeError, match="do not match"):
        TreeAttentionPlan.build(library.load(), wrong, impl, layer, query, kv_cache, md)


def test_ancestor_bitsets_cross_word_boundaries():
    rng = random.Random(0)
    mask = random_mask(130, rng)
    bits = ancestor_bitsets(mask, words=3)
    assert bits.shape == (130, 3)
    for u in (0, 63, 64, 65, 129):
        for v in range(130):
            assert bool((int(bits[u, v // 64]) >> (v % 64)) & 1) == bool(mask[u, v])


def test_the_kernel_builds_once_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_LOOKAHEAD_CACHE", str(tmp_path))
    first = kernel.build()
    mtime = first.stat().st_mtime_ns
    assert kernel.build() == first and first.stat().st_mtime_ns == mtime
    assert library.CompiledLibrary(first).vector_width in (4, 8, 16)


def test_without_a_compiler_the_kernel_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_LOOKAHEAD_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        kernel.build()
