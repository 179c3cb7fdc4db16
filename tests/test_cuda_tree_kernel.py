"""The Triton tree-attention kernel (backends/cuda/tree_kernel.py) on CPU tensors under Triton's interpreter.

Triton decides at decoration time whether a @triton.jit function is interpreted, and triton.language's own helpers
(tl.zeros, tl.max, ...) are decorated when triton is first imported: TRITON_INTERPRET=1 must be set before that,
and in a whole-suite run earlier tests have imported triton already (vLLM imports it). So the kernel tests
(`@interpreted`) run in a child pytest started with TRITON_INTERPRET=1 (`test_kernel_under_triton_interpreter`);
in the parent process they are not collected and nothing is set in its environment. Run them directly with
`TRITON_INTERPRET=1 pytest tests/test_cuda_tree_kernel.py`. The descriptor tests run in the parent.

The interpreter's dot cannot multiply bfloat16 (it holds it as uint16), so the kernel computes bfloat16 tiles'
dots in float32 there (the inputs and the probabilities still rounded to bfloat16 as on the GPU).
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.interpreted import run_in_interpreter

pytest.importorskip("triton")

from vllm_lookahead.backends.base import TreeRows  # noqa: E402
from vllm_lookahead.backends.cuda import tree_kernel as tk  # noqa: E402
from vllm_lookahead.backends.cuda.reference import gather_paged, reference_tree_attention  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ROOT = Path(__file__).resolve().parents[1]


def interpreted(fn: Callable) -> Callable:
    """A test that launches Triton kernels: collected only where TRITON_INTERPRET=1 was set before triton loaded."""
    fn._interpreted = True  # type: ignore[attr-defined]
    return fn


# --- building batches -------------------------------------------------------------------------------------------


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for u in range(1, n):
        mask[u, :u] = mask[parents[u], :u]
    return mask


def random_parents(n: int, rng: random.Random) -> list[int]:
    return [-1] + [rng.randrange(u) for u in range(1, n)]


@dataclass
class Batch:
    query: torch.Tensor  # [T, H, D]
    key_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor
    block_table: torch.Tensor  # int32 [num_reqs, max_blocks]
    rows: list[TreeRows]
    query_start_loc: list[int]  # per request, then the total
    seq_lens: list[int]
    tree_rows: torch.Tensor  # bool [T]


def make_batch(
    reqs: Sequence[tuple],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    interleaved_kv: bool = False,
) -> Batch:
    """reqs: ("plain", query_len, context_len) or ("tree", num_nodes, prefix_len[, mask]) in batch order. Each request
    gets shuffled, non-adjacent cache blocks; interleaved_kv stores K and V block by block ([num_blocks, 2, ...]
    transposed), so the cache halves are strided views."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    lens = [r[1] + r[2] for r in reqs]
    need = [-(-s // block_size) for s in lens]
    num_blocks = 2 * sum(need) + 3
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    max_blocks = max(need) + 2
    block_table = torch.zeros(len(reqs), max_blocks, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    if interleaved_kv:
        kv = torch.randn(num_blocks, 2, *shape[1:], generator=gen).to(dtype).transpose(0, 1)
    else:
        kv = torch.randn(2, *shape, generator=gen).to(dtype)
    key_cache, value_cache = kv.unbind(0)
    rows, starts, tree_rows = [], [], []
    q_start = 0
    for i, r in enumerate(reqs):
        block_table[i, : need[i]] = torch.tensor(ids[2 * sum(need[:i]) :: 2][: need[i]], dtype=torch.int32)
        starts.append(q_start)
        if r[0] == "tree":
            n = r[1]
            mask = r[3] if len(r) > 3 else ancestor_mask(random_parents(n, rng))
            rows.append(TreeRows(i, q_start, n, lens[i], block_table[i].clone(), mask))
        tree_rows += [r[0] == "tree"] * r[1]
        q_start += r[1]
    query = torch.randn(q_start, num_heads, head_size, generator=gen).to(dtype)
    return Batch(
        query, key_cache, value_cache, block_table, rows, [*starts, q_start], lens, torch.tensor(tree_rows, dtype=bool)
    )


def run_kernel(b: Batch, block_m: int | None, block_n: int | None = None, splits: int | None = None) -> torch.Tensor:
    num_heads, head_size = b.query.shape[1:]
    out = torch.full_like(b.query, float("nan"))  # poisoned: plain rows must stay NaN
    batch = tk.TreeBatch.build(
        b.rows, "cpu", num_heads=num_heads, num_kv_heads=b.key_cache.shape[2], block_m=block_m, num_splits=splits
    )
    assert splits is None or batch.num_splits == splits
    tk.tree_attention(b.query, b.key_cache, b.value_cache, b.block_table, batch, head_size**-0.5, out, block_n=block_n)
    return out


# ||out - ref|| / ||ref|| over a tree's rows, the reference kept in float32: half precision's output rounding and
# the probabilities rounded for the PV dot (as on the GPU) are what is left
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1.5e-3, torch.bfloat16: 1e-2}


def check_against_reference(b: Batch, out: torch.Tensor) -> None:
    ref = torch.full(out.shape, float("nan"))
    reference_tree_attention(b.query, b.key_cache, b.value_cache, b.rows, b.query.shape[2] ** -0.5, ref)
    assert torch.isnan(out[~b.tree_rows]).all(), "plain rows were written"
    assert torch.isfinite(out[b.tree_rows]).all()
    for t in b.rows:  # each tree on its own, so that one wrong tree cannot hide in the batch's norm
        sl = slice(t.q_start, t.q_start + t.num_nodes)
        err = ((out[sl].float() - ref[sl]).norm() / ref[sl].norm()).item()
        assert err < TOLERANCE[out.dtype], (t.req_index, t.num_nodes, t.seq_len, err)


# --- descriptor tests (no launch: run in every process) -------------------------------------------------------------


def test_bits_and_tiles_describe_the_trees():
    rng = random.Random(1)
    masks = [ancestor_mask(random_parents(n, rng)) for n in (1, 40, 128, 5)]
    rows = [TreeRows(i + 2, 100 * i, m.shape[0], m.shape[0] + 7 * i, torch.zeros(1), m) for i, m in enumerate(masks)]
    b = tk.TreeBatch.build(rows, "cpu", num_heads=12, num_kv_heads=4, block_m=32)
    assert b.num_words == 4 and b.bits.shape == (1 + 40 + 128 + 5, 4)
    base = 0
    for m in masks:
        n = m.shape[0]
        words = b.bits[base : base + n].long() & 0xFFFFFFFF
        bits = (words[:, :, None] >> torch.arange(32)) & 1
        assert torch.equal(bits.reshape(n, -1)[:, :n].bool(), m)
        assert not bits.reshape(n, -1)[:, n:].any()
        base += n
    tiles = b.tiles
    assert b.num_tiles == sum(-(-m.shape[0] * 3 // 32) for m in masks) == tiles.shape[0]
    for i, m in enumerate(masks):
        mine = tiles[tiles[:, 0] == i + 2]
        n = m.shape[0]
        assert (mine[:, 1] == 100 * i).all() and (mine[:, 2] == n).all() and (mine[:, 3] == 7 * i).all()
        assert mine[:, 5].tolist() == list(range(0, n * 3, 32))
        # ancestor masks: a tile's nodes attend nothing past its last node
        assert mine[:, 6].tolist() == [min(n, (r0 + 31) // 3 + 1) for r0 in mine[:, 5].tolist()]


def test_tree_end_covers_a_mask_that_looks_ahead():
    mask = torch.eye(40, dtype=torch.bool)
    mask[0, 37] = True  # not an ancestor mask: node 0 attends node 37
    b = tk.TreeBatch.build(
        [TreeRows(0, 0, 40, 50, torch.zeros(1), mask)], "cpu", num_heads=1, num_kv_heads=1, block_m=16
    )
    assert b.tiles[:, 6].tolist() == [38, 38, 40]


def test_build_refuses_bad_input():
    m = torch.eye(3, dtype=torch.bool)
    with pytest.raises(ValueError, match="mask"):
        tk.TreeBatch.build([TreeRows(0, 0, 4, 9, torch.zeros(1), m)], "cpu", num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match="multiple"):
        tk.TreeBatch.build([TreeRows(0, 0, 3, 9, torch.zeros(1), m)], "cpu", num_heads=3, num_kv_heads=2)
    with pytest.raises(ValueError, match="seq_len"):
        tk.TreeBatch.build([TreeRows(0, 0, 3, 2, torch.zeros(1), m)], "cpu", num_heads=2, num_kv_heads=1)
    empty = tk.TreeBatch.build([], "cpu", num_heads=2, num_kv_heads=1)
    assert empty.num_tiles == 0


def test_tiling_fills_the_sms():
    assert tk.choose_tiling([128] * 64, [2048] * 64, 4, 8, 132) == (64, 1)  # plenty of programs: the tallest auto tile
    bm, splits = tk.choose_tiling([16], [8192], 4, 8, 132)  # one short tree over a long prefix: split it
    assert splits > 1 and bm <= 64 and -(-16 * 4 // bm) * 8 * splits >= 64
    assert tk.choose_tiling([16], [300], 4, 8, 132)[1] == 1  # too short a prefix to be worth a second launch
    assert tk.choose_tiling([], [], 4, 8, 132) == (16, 1)


def test_reference_matches_the_cpu_reference():
    """The CUDA-layout reference against the CPU backend's (dense K/V, SDPA), GQA, a tree and a prefix."""
    from vllm_lookahead.backends.cpu.reference import tree_attention

    b = make_batch(
        [("plain", 2, 3), ("tree", 9, 21)], num_heads=4, num_kv_heads=2, head_size=32, block_size=8,
        dtype=torch.float32, seed=3,
    )  # fmt: skip
    (t,) = b.rows
    out = reference_tree_attention(b.query, b.key_cache, b.value_cache, b.rows, 0.3, torch.zeros_like(b.query))
    k, v = gather_paged(b.key_cache, t.block_ids, t.seq_len), gather_paged(b.value_cache, t.block_ids, t.seq_len)
    assert torch.equal(k[1, 12], b.key_cache[t.block_ids[1], 4, 1])
    sl = slice(t.q_start, t.q_start + t.num_nodes)
    torch.testing.assert_close(out[sl], tree_attention(b.query[sl], k, v, t.mask, 0.3), atol=1e-5, rtol=1e-5)
    assert not out[:2].any()


# --- kernel tests (under the interpreter) --------------------------------------------------------------------------


def _random_mask(n: int, seed: int) -> torch.Tensor:
    mask = torch.rand(n, n, generator=torch.Generator().manual_seed(seed)) < 0.3
    return mask | torch.eye(n, dtype=torch.bool)


KERNEL_CASES = {
    # qpk 1; trees with and without a partial prefix tile, no prefix, prefix one block exactly, 33 nodes (two
    # words), an arbitrary (non-ancestor) mask; plain decode and prefill rows between them
    "fp16-d64-qpk1": dict(
        reqs=[
            ("plain", 1, 30),
            ("tree", 7, 37),
            ("plain", 5, 0),
            ("tree", 1, 20),
            ("tree", 33, 16),
            ("tree", 3, 0),
            ("tree", 12, 9, _random_mask(12, 0)),
        ],
        heads=(2, 2),
        head_size=64,
        block_size=16,
        dtype=torch.float16,
        block_m=16,
        block_n=16,
    ),
    # GQA 4, head 128, K/V interleaved block by block (strided cache halves)
    "bf16-d128-qpk4": dict(
        reqs=[("tree", 20, 50), ("plain", 3, 11), ("tree", 5, 17)],
        heads=(8, 2),
        head_size=128,
        block_size=16,
        dtype=torch.bfloat16,
        block_m=32,
        block_n=32,
        interleaved=True,
    ),
    # GQA 8, block size 8, bigger tiles: one tile spans several nodes and the tree spans several prefix blocks
    "fp16-d64-qpk8": dict(
        reqs=[("plain", 2, 6), ("tree", 11, 29), ("tree", 2, 3)],
        heads=(8, 1),
        head_size=64,
        block_size=8,
        dtype=torch.float16,
        block_m=64,
        block_n=16,
    ),
    # a full-size tree (128 nodes: four words), float32
    "fp32-d64-128nodes": dict(
        reqs=[("tree", 128, 24), ("plain", 1, 5)],
        heads=(1, 1),
        head_size=64,
        block_size=16,
        dtype=torch.float32,
        block_m=64,
        block_n=32,
    ),
    # the prefix split over 3 programs a tile and merged: segments of whole key tiles, an empty segment (prefix of
    # one tile), a tree without a prefix (only the last segment has keys)
    "fp16-d64-qpk2-split3": dict(
        reqs=[("tree", 9, 70), ("plain", 2, 9), ("tree", 4, 16), ("tree", 5, 0), ("tree", 30, 33)],
        heads=(4, 2),
        head_size=64,
        block_size=16,
        dtype=torch.float16,
        block_m=16,
        block_n=16,
        splits=3,
    ),
    "bf16-d128-qpk8-split2": dict(
        reqs=[("tree", 17, 45), ("plain", 1, 40)],
        heads=(8, 1),
        head_size=128,
        block_size=8,
        dtype=torch.bfloat16,
        block_m=64,
        block_n=16,
        splits=2,
    ),
    # a head size that is not a power of two (padded to 128), the launcher's own tile choice
    "bf16-d80-qpk2-auto": dict(
        reqs=[("tree", 6, 13), ("plain", 1, 2)],
        heads=(4, 2),
        head_size=80,
        block_size=16,
        dtype=torch.bfloat16,
        block_m=None,
        block_n=None,
    ),
}


@interpreted
@pytest.mark.parametrize("seed", range(10))
def test_kernel_on_random_batches(seed: int):
    """Random mixes of trees (random parent lists) and plain rows, GQA groups, head sizes, dtypes and tiles."""
    rng = random.Random(seed)
    reqs = []
    for _ in range(rng.randint(1, 5)):
        if rng.random() < 0.6:
            reqs.append(("tree", rng.choice([1, 2, rng.randint(3, 48)]), rng.choice([0, rng.randint(1, 90)])))
        else:
            reqs.append(("plain", rng.randint(1, 4), rng.randint(0, 40)))
    if not any(r[0] == "tree" for r in reqs):
        reqs.append(("tree", rng.randint(1, 20), rng.randint(0, 40)))
    num_kv_heads, qpk = rng.choice([1, 2]), rng.choice([1, 2, 3, 4, 8])
    b = make_batch(
        reqs, num_heads=num_kv_heads * qpk, num_kv_heads=num_kv_heads, head_size=rng.choice([64, 128]),
        block_size=rng.choice([8, 16]), dtype=(torch.float16, torch.bfloat16, torch.float32)[seed % 3], seed=seed,
        interleaved_kv=rng.random() < 0.5,
    )  # fmt: skip
    splits = rng.choice([1, 1, 2, 3, 5])
    check_against_reference(b, run_kernel(b, rng.choice(tk.BLOCK_M_CHOICES), rng.choice([16, 32, 64]), splits))


@interpreted
@pytest.mark.parametrize("name", list(KERNEL_CASES))
def test_kernel_matches_reference(name: str):
    c = KERNEL_CASES[name]
    b = make_batch(
        c["reqs"], num_heads=c["heads"][0], num_kv_heads=c["heads"][1], head_size=c["head_size"],
        block_size=c["block_size"], dtype=c["dtype"], seed=len(name), interleaved_kv=c.get("interleaved", False),
    )  # fmt: skip
    check_against_reference(b, run_kernel(b, c["block_m"], c["block_n"], c.get("splits")))


def _vllm_unified_attention() -> Callable:
    """vLLM 0.32's Triton unified attention, its kernels interpreted. vLLM's CPU build exports placeholders for
    triton / tl (it turns Triton off without a CPU backend): the real modules are swapped in while the two kernel
    modules import, which then leave sys.modules as they were."""
    import importlib

    import triton
    import triton.language as tl
    import vllm.triton_utils as tu

    names = ["vllm.v1.attention.ops.triton_attention_helpers", "vllm.v1.attention.ops.triton_unified_attention"]
    saved_modules = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    saved = (tu.triton, tu.tl)
    tu.triton, tu.tl = triton, tl
    try:
        return importlib.import_module(names[1]).unified_attention
    finally:
        tu.triton, tu.tl = saved
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved_modules)


@interpreted
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # vLLM's kernel, its padding rows
def test_chains_match_vllm_unified_attention():
    """A chain is a tree: its rows are vLLM's causal rows (fp16: the interpreter's dot cannot do bfloat16)."""
    unified_attention = _vllm_unified_attention()
    chain = ancestor_mask(list(range(-1, 8)))
    b = make_batch(
        [("tree", 4, 21, chain[:4, :4]), ("plain", 1, 30), ("tree", 9, 40, chain), ("plain", 6, 0)],
        num_heads=4, num_kv_heads=2, head_size=64, block_size=16, dtype=torch.float16, seed=7,
    )  # fmt: skip
    ref = torch.zeros_like(b.query)
    unified_attention(
        q=b.query, k=b.key_cache, v=b.value_cache, out=ref,
        cu_seqlens_q=torch.tensor(b.query_start_loc, dtype=torch.int32), max_seqlen_q=9,
        seqused_k=torch.tensor(b.seq_lens, dtype=torch.int32), max_seqlen_k=max(b.seq_lens),
        softmax_scale=64**-0.5, causal=True, window_size=(-1, -1), block_table=b.block_table, softcap=0,
        q_descale=None, k_descale=None, v_descale=None,
    )  # fmt: skip
    out = run_kernel(b, block_m=16, block_n=16)
    assert torch.isnan(out[~b.tree_rows]).all()
    diff = (out[b.tree_rows].float() - ref[b.tree_rows].float()).abs().max().item()
    assert diff < 2e-3, diff
    check_against_reference(b, out)


@interpreted
def test_gpu_script_logic_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """benchmarks/diagnostics/gpu_tree_attention.py end to end with --device cpu (tiny shapes, the interpreter):
    its correctness cases, the timing table against SDPA, the sweep, the JSON and the plot."""
    import importlib.util

    path = ROOT / "benchmarks" / "diagnostics" / "gpu_tree_attention.py"
    spec = importlib.util.spec_from_file_location("_gpu_tree_attention", path)
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)  # dataclasses look their module up
    spec.loader.exec_module(script)
    assert script.main(["--device", "cpu", "--quick", "--sweep", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_tree_attention.json").read_text())
    assert report["correctness"] and all(c["ok"] for c in report["correctness"])
    assert len(report["timing"]) == 4 and all(r["ms"]["kernel"] > 0 and r["ratio"] > 0 for r in report["timing"])
    assert report["sweep"] and report["sweep"][0]["tilings"]
    assert (tmp_path / "gpu_tree_attention.png").stat().st_size > 0


@interpreted
def test_gpu_glue_script_logic_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """benchmarks/diagnostics/gpu_glue.py (what gpu_check.py runs first on a GPU) with --device cpu: every variant
    launched once, the backend on vLLM-shaped caches in the three layouts, move_cells with 1, 16, 17 and 200 moves,
    the JSON and the plot (the sync section needs CUDA and says so; the kernel cases have their own test above)."""
    import importlib.util

    path = ROOT / "benchmarks" / "diagnostics" / "gpu_glue.py"
    spec = importlib.util.spec_from_file_location("_gpu_glue", path)
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)
    spec.loader.exec_module(script)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))  # the script points it at a fresh folder
    assert script.main(["--device", "cpu", "--quick", "--skip-kernel", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_glue.json").read_text())
    assert report["failed"] == []
    assert len(report["compile"]["variants"]) == len(tk.variants()) + 1
    assert [c["layout"] for c in report["glue"]] == ["LBNHC", "BLNHC", "LBHNC"] and all(c["ok"] for c in report["glue"])
    assert [m["moves"] for m in report["moves"]] == [1, 16, 17, 200] and all(m["ok"] for m in report["moves"])
    assert report["syncs"]["skipped"] == "no CUDA"
    assert (tmp_path / "gpu_glue.png").stat().st_size > 0


# --- compiled for a GPU (no GPU needed) ------------------------------------------------------------------------------


def _compile_sm90(fn, constexprs: dict, pointer_types: dict) -> object:
    """triton.compile for an H100 (sm_90) with Triton's bundled ptxas: the real compiler's checks, no device."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {}
    for name in fn.arg_names:
        sig[name] = "constexpr" if name in constexprs else pointer_types.get(name, "i32")
    if "qk_scale" in sig:
        sig["qk_scale"] = "fp32"
    return triton.compile(ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def test_kernels_compile_for_sm90(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The interpreter accepts what the compiler may not (types, constexpr use): both kernels through Triton's CUDA
    compiler down to a cubin, the split path and a padded head size."""
    import triton.backends

    if INTERPRETED:
        pytest.skip("TRITON_INTERPRET=1: the kernels are interpreted functions here")
    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton has no CUDA backend")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # its default, set: no warning
    half = {n: "*bf16" for n in ("q_ptr", "o_ptr", "k_ptr", "v_ptr")}
    ints = {n: "*i32" for n in ("bt_ptr", "tiles_ptr", "bits_ptr")}
    ws = {"ws_acc_ptr": "*fp32", "ws_ml_ptr": "*fp32"}
    unit = {n: 1 for n in ("stride_qd", "stride_od", "stride_kd", "stride_vd", "stride_btc")}
    main = dict(QPK=4, HEAD=80, HEAD_PAD=128, PAD_D=True, BLOCK_SIZE=16, BLOCK_M=64, BLOCK_N=64, TREE_N=32,
                SPLIT=True, UPCAST=False, **unit)  # fmt: skip
    kernel = _compile_sm90(tk._tree_attention_kernel, main, {**half, **ints, **ws})
    assert kernel.asm["cubin"]
    combine = dict(QPK=4, HEAD=80, HEAD_PAD=128, BLOCK_M=64, stride_od=1)
    assert _compile_sm90(tk._combine_splits_kernel, combine, {"o_ptr": "*bf16", "tiles_ptr": "*i32", **ws}).asm["cubin"]


# --- the CUDA backend's glue: vLLM's cache layout, the forward it wraps, relocation -----------------------------


def vllm_cache(b: Batch) -> torch.Tensor:
    """b's cache halves as one layer's cache in FLASH_ATTN / TRITON_ATTN's layout: logical
    [num_blocks, num_kv_heads, block_size, 2 * head_size], laid out block, token, head (K then V per head)."""
    cells = torch.cat([b.key_cache, b.value_cache], dim=-1).contiguous()  # [num_blocks, block_size, Hkv, 2D]
    return cells.transpose(1, 2)


@interpreted
def test_cuda_backend_writes_the_tree_rows_over_vllms_forward():
    """`attend`: vLLM's forward for every row, then the tree rows by the kernel from the cache in vLLM's layout,
    descriptors built at the step's first layer only."""
    from types import SimpleNamespace

    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend, split

    b = make_batch(
        [("plain", 3, 20), ("tree", 9, 37), ("plain", 1, 5), ("tree", 5, 16)], num_heads=4, num_kv_heads=2,
        head_size=32, block_size=8, dtype=torch.float16, seed=11,
    )  # fmt: skip
    kv_cache = vllm_cache(b)
    key_cache, value_cache = split(kv_cache, 32)
    assert torch.equal(key_cache, b.key_cache) and torch.equal(value_cache, b.value_cache)
    impl = SimpleNamespace(num_heads=4, num_kv_heads=2, head_size=32, scale=32**-0.5)
    md = SimpleNamespace(block_table=b.block_table)
    calls = []

    def vllm_forward(impl_, layer, query, key, value, kv, md_, output):
        calls.append(kv)
        return output.fill_(7.0)  # stands for vLLM's rows: plain rows must keep them

    backend, plans = CudaTreeBackend(), {}
    for _ in range(2):  # two layers of one step
        out = torch.full_like(b.query, float("nan"))
        backend.attend(b.rows, plans, vllm_forward, impl, None, b.query, None, None, kv_cache, md, out)
        assert (out[~b.tree_rows] == 7.0).all()
        out[~b.tree_rows] = float("nan")
        check_against_reference(b, out)
    assert len(calls) == 2 and len(plans) == 1 and backend.used_kernel(plans)
    with pytest.raises(RuntimeError, match="fused output quantization"):
        backend.attend(b.rows, plans, vllm_forward, impl, None, b.query, None, None, kv_cache, md, out, torch.ones(1))


@interpreted
def test_relocation_moves_every_layers_cells_in_two_launches():
    """`relocation.move_cells` over alike caches in vLLM's layout (bfloat16 and float32 bits), overlapping moves read
    before any write, other slots untouched; and the backend takes that path for alike caches."""
    from types import SimpleNamespace

    from vllm_lookahead.backends.cuda import relocation
    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend

    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.bfloat16, torch.float32):
        cells = [torch.randn(5, 8, 2, 48, generator=gen).to(dtype) for _ in range(4)]  # [blocks, tokens, Hkv, 2D]
        caches = [c.transpose(1, 2) for c in cells]
        assert relocation.cells_alike(caches)
        before = [c.clone() for c in cells]
        src, dst = [9, 10, 11, 30], [10, 11, 12, 2]  # a run shifted up by one slot, and a move across blocks
        CudaTreeBackend().relocate([SimpleNamespace(kv_cache=c) for c in caches], src, dst)
        for c, old in zip(cells, before, strict=True):
            want = old.reshape(40, 2, 48).clone()
            want[dst] = old.reshape(40, 2, 48)[src]
            assert torch.equal(c.reshape(40, 2, 48), want), dtype


def _tilings_chosen() -> set[tuple[int, bool]]:
    """Every (BLOCK_M, split) `choose_tiling` picks over steps from one short tree to many long ones, few and many
    SMs, GQA groups of 1 to 8."""
    chosen = set()
    for nodes in ([1], [8], [32] * 4, [128] * 64):
        for prefix in (0, 700, 4096, 16384):
            for qpk in (1, 4, 8):
                for kv_heads in (1, 8):
                    for sms in (1, 132):
                        bm, splits = tk.choose_tiling(nodes, [prefix] * len(nodes), qpk, kv_heads, sms)
                        chosen.add((bm, splits > 1))
    return chosen


@interpreted
def test_warm_up_launches_every_variant_a_step_can_choose(monkeypatch: pytest.MonkeyPatch):
    """`CudaTreeBackend.warm_up` (through the engine's warm-up) launches the tree kernel at every tile height and
    split the tiling chooses, the merge at every split height, and both KV-move kernels, on the model's own caches,
    which it leaves as they were."""
    from types import SimpleNamespace

    from vllm_lookahead.backends.cuda import relocation
    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.glue.engine import LookaheadEngine

    launched: list[tuple[str, tuple]] = []

    def recorded(name: str, kernel, keys: tuple[str, ...]):
        class Launcher:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    launched.append((name, tuple(kwargs[k] for k in keys)))
                    return kernel[grid](*args, **kwargs)

                return launch

        return Launcher()

    monkeypatch.setattr(tk, "_tree_attention_kernel", recorded("tree", tk._tree_attention_kernel, ("BLOCK_M", "SPLIT")))
    monkeypatch.setattr(tk, "_combine_splits_kernel", recorded("merge", tk._combine_splits_kernel, ("BLOCK_M",)))
    monkeypatch.setattr(relocation, "_copy_cells", recorded("moves", relocation._copy_cells, ("SIDE",)))
    impl_cls = type("TritonAttentionImpl", (), {})
    layers = []
    for i in range(3):
        impl = impl_cls()
        impl.num_heads, impl.num_kv_heads, impl.head_size, impl.scale = 4, 2, 32, 32**-0.5
        kv = torch.randn(4, 16, 2, 64, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16).transpose(1, 2)
        layers.append(SimpleNamespace(impl=impl, kv_cache=kv, layer_name=f"model.layers.{i}.attn"))
    before = [layer.kv_cache.clone() for layer in layers]
    backend = CudaTreeBackend()
    assert backend.check_layers(layers) is None
    engine = LookaheadEngine(LookaheadParams(node_cost=0.0), 1024, backend=(backend, "trees"))
    engine.layers = layers
    engine.warm_up(runner=None)  # fixed costs: the backend's warm-up alone
    tree = {key for name, key in launched if name == "tree"}
    assert tree == set(tk.variants()) and _tilings_chosen() <= tree, (tree, _tilings_chosen())
    assert {key for name, key in launched if name == "merge"} == {(bm,) for bm, split in tk.variants() if split}
    assert sorted(key for name, key in launched if name == "moves") == [(0,), (1,)]
    assert all(torch.equal(layer.kv_cache, old) for layer, old in zip(layers, before, strict=True))


# --- the parent's delegate ----------------------------------------------------------------------------------------

_INTERPRETED_TESTS = [n for n, f in list(globals().items()) if n.startswith("test_") and getattr(f, "_interpreted", 0)]
if not INTERPRETED:
    for _name in _INTERPRETED_TESTS:
        del globals()[_name]

    def test_kernel_under_triton_interpreter():
        """The @interpreted tests, in a child pytest whose triton loads with TRITON_INTERPRET=1."""
        run_in_interpreter(__file__, _INTERPRETED_TESTS, timeout=300)
