"""The CUDA path's glue through vLLM 0.32's own classes on a CPU, the platform said to be CUDA where it matters.

- A real `VllmConfig` with lookahead: the V1 runner is chosen, the runner's start leaves the user's CUDA graph mode as
  it was and takes the CUDA tree backend, and vLLM's own dispatch (`GPUModelRunner._determine_batch_execution_and_
  padding` over a real `CudagraphDispatcher`) gives steps without tree rows the user's graphs and steps with tree
  rows no full graph (`glue/cuda_graphs.py`).
- The guards, on vLLM's own config and layer classes: Model Runner V2 forced, pipeline parallelism on CUDA, hybrid
  models (a real Jamba `ModelConfig`), chunked local attention (real `ChunkedLocalAttention` layers) and recurrent
  layers (a real `ShortConv`, in the child below: it needs vLLM's distributed groups).
- vLLM's own `TritonAttentionImpl.forward`, patched, reached through vLLM's `unified_attention_with_output` under
  Triton's interpreter, on caches allocated by vLLM (`allocate_kv_cache` -> `create_kv_cache_views`: one int8
  allocation, several layers) in three layouts, the query a strided slice of a fused QKV tensor, the output padded
  and poisoned: the tree rows are the reference's, the other rows vLLM's own bit for bit, nothing past the real
  tokens written; and the accepted nodes' KV moved in every layer.

The tests marked `isolated` run in a child pytest with TRITON_INTERPRET=1 set before Triton loads (as
tests/test_cuda_tree_kernel.py explains), which also keeps vLLM's distributed groups out of this process.
"""

from __future__ import annotations

import importlib
import os
import random
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from tests.interpreted import run_in_interpreter

pytest.importorskip("triton")

ISOLATED = os.environ.get("TRITON_INTERPRET") == "1"
ROOT = Path(__file__).resolve().parents[1]
SMALL_TREES = {"window_size": 2, "ngram_size": 2, "guess_set_size": 2, "lookup_candidates": 1, "lookup_len": 4,
               "suffix_candidates": 0, "recycle_candidates": 0}  # fmt: skip


def isolated(fn: Callable) -> Callable:
    fn._isolated = True  # type: ignore[attr-defined]
    return fn


def force_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's platform answers as CUDA's, with Triton (what the V2 runner choice and the backend choice read). Called
    once the configs and layers a test needs are built: vLLM's modules would take CUDA's paths while importing."""
    import vllm.config.vllm as vllm_config_module
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", True)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)


def _config(model_path: str, speculative: dict | None = None) -> Any:
    """A real VllmConfig of the default model in bfloat16 (built on this CPU, before the platform is forced)."""
    from vllm.engine.arg_utils import EngineArgs

    spec = {"method": "lookahead", **SMALL_TREES} if speculative is None else speculative
    return EngineArgs(
        model=model_path, dtype="bfloat16", max_model_len=512, speculative_config=spec
    ).create_engine_config()


def _user_graphs(cfg: Any, mode: Any) -> int:
    """The user's CUDA graph settings as vLLM resolves them on a GPU: `mode`, piecewise compilation split at
    attention, capture sizes that hold uniform decode batches. Returns the uniform decode query length."""
    from vllm.config.compilation import CompilationMode

    cc = cfg.compilation_config
    q = cfg.uniform_decode_query_len
    cc.mode = CompilationMode.VLLM_COMPILE
    cc.splitting_ops = list(cc._attention_ops)
    cc.cudagraph_mode = mode
    cc.cudagraph_capture_sizes = [1, 2, 4, 8, q, 2 * q, 4 * q]
    cc.max_cudagraph_capture_size = 4 * q
    return q


def _runner(cfg: Any, engine: Any, mode: Any, q: int) -> Any:
    """What `_determine_batch_execution_and_padding` reads of a runner, around vLLM's real dispatcher."""
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    dispatcher = CudagraphDispatcher(cfg)
    dispatcher.initialize_cudagraph_keys(mode, q)
    return SimpleNamespace(
        uniform_decode_query_len=q, _is_uniform_decode=GPUModelRunner._is_uniform_decode,
        model_config=cfg.model_config, input_batch=SimpleNamespace(lora_id_to_lora_request={}),
        cudagraph_dispatcher=dispatcher, vllm_config=cfg, parallel_config=cfg.parallel_config,
        compilation_config=cfg.compilation_config, _lookahead=engine,
    )  # fmt: skip


def _graph(runner: Any, per_request: list[int], trees: bool) -> str:
    """The graph vLLM's dispatch picks for a step of those query lengths, with or without tree rows."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_lookahead.backends import TreeRows
    from vllm_lookahead.glue.step import LookaheadStep

    engine = runner._lookahead
    rows = [TreeRows(0, 0, 3, 10, torch.zeros(1), torch.eye(3, dtype=torch.bool))] if trees else []
    engine.step = LookaheadStep(proposed={}, backend=engine.backend, attention_rows=rows)
    try:
        mode, *_ = GPUModelRunner._determine_batch_execution_and_padding(
            runner, num_tokens=sum(per_request), num_reqs=len(per_request),
            num_scheduled_tokens_np=np.array(per_request, dtype=np.int32), max_num_scheduled_tokens=max(per_request),
        )  # fmt: skip
    finally:
        engine.step = None
    return mode.name


def test_lookahead_on_cuda_takes_the_v1_runner_and_trees_and_keeps_the_users_graphs(
    model_path: str, monkeypatch: pytest.MonkeyPatch
):
    from vllm.config.compilation import CUDAGraphMode

    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend
    from vllm_lookahead.glue import platform
    from vllm_lookahead.glue.patches import model_runner

    cfg = _config(model_path)
    q = _user_graphs(cfg, CUDAGraphMode.FULL_AND_PIECEWISE)
    force_cuda(monkeypatch)
    assert cfg.use_v2_model_runner is False  # Triton present, but lookahead keeps the V1 runner
    runner = SimpleNamespace()
    model_runner._init(lambda self, vllm_config, *a, **k: None)(runner, cfg)  # the patched start, vLLM's own stubbed
    engine = model_runner.engine_of(runner)
    assert isinstance(engine.backend, CudaTreeBackend), engine.backend_reason
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE  # nothing lowered at start-up
    runner = _runner(cfg, engine, CUDAGraphMode.FULL_AND_PIECEWISE, q)
    decode, mixed = [q, q], [q, 1, 7]
    assert _graph(runner, decode, trees=False) == "FULL"  # plain decode / chain steps: vLLM's full graph
    assert _graph(runner, decode, trees=True) == "PIECEWISE"  # the same batch with tree rows: attention outside
    assert _graph(runner, mixed, trees=False) == _graph(runner, mixed, trees=True) == "PIECEWISE"
    assert _graph(runner, [1], trees=False) == "PIECEWISE"  # prefill and mixed batches as vLLM dispatches them
    said = platform.graph_modes(runner, trees=True)
    assert "FULL_AND_PIECEWISE" in said and "tree rows run PIECEWISE" in said, said


def test_full_decode_graphs_stay_for_plain_steps_and_chains(model_path: str, monkeypatch: pytest.MonkeyPatch):
    """Under FULL_DECODE_ONLY (no piecewise graphs) a step with tree rows runs without graphs and every other step
    keeps its full graph; an engine that runs chains keeps the user's graphs for every step."""
    from vllm.config.compilation import CUDAGraphMode

    from vllm_lookahead.backends import ChainBackend
    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.glue import platform
    from vllm_lookahead.glue.engine import LookaheadEngine

    cfg = _config(model_path)
    q = _user_graphs(cfg, CUDAGraphMode.FULL_DECODE_ONLY)
    force_cuda(monkeypatch)
    trees = LookaheadEngine(LookaheadParams(**SMALL_TREES), 512, backend=(CudaTreeBackend(), "trees"))
    runner = _runner(cfg, trees, CUDAGraphMode.FULL_DECODE_ONLY, q)
    assert _graph(runner, [q, q], trees=False) == "FULL"
    assert _graph(runner, [q, q], trees=True) == "NONE"
    assert "tree rows run NONE" in platform.graph_modes(runner, trees=True)
    chains = LookaheadEngine(LookaheadParams(**SMALL_TREES), 512, backend=(ChainBackend(), "chains"))
    runner = _runner(cfg, chains, CUDAGraphMode.FULL_DECODE_ONLY, q)
    assert _graph(runner, [q, q], trees=False) == "FULL"
    assert "every step runs under vLLM's FULL_DECODE_ONLY" in platform.graph_modes(runner, trees=False)


# --- guards -----------------------------------------------------------------------------------------------------


def test_model_runner_v2_is_refused_at_start_up(model_path: str, monkeypatch: pytest.MonkeyPatch):
    cfg = _config(model_path)
    plain = _config(model_path, speculative={"method": "ngram", "num_speculative_tokens": 2})
    force_cuda(monkeypatch)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ValueError, match="lookahead: runs on vLLM's V1 model runner only.*VLLM_USE_V2_MODEL_RUNNER"):
        _ = cfg.use_v2_model_runner
    assert plain.use_v2_model_runner is True  # inert without lookahead


def test_pipeline_parallelism_is_refused_on_cuda(monkeypatch: pytest.MonkeyPatch):
    from vllm.config import ParallelConfig
    from vllm.config.speculative import SpeculativeConfig

    pipeline, single = ParallelConfig(pipeline_parallel_size=2), ParallelConfig()
    force_cuda(monkeypatch)
    with pytest.raises(ValueError, match=r"lookahead: pipeline_parallel_size must be 1 \(got 2\)"):
        SpeculativeConfig(method="lookahead", target_parallel_config=pipeline)
    assert SpeculativeConfig(method="lookahead", target_parallel_config=single).method == "lookahead"


def test_hybrid_models_are_refused_at_start_up(tmp_path: Path):
    """A real ModelConfig of a (tiny, local) Jamba: Mamba layers beside attention."""
    from transformers import JambaConfig
    from vllm.config import ModelConfig
    from vllm.config.speculative import SpeculativeConfig

    hf = JambaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=128, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                     expert_layer_offset=1, num_experts=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2)  # fmt: skip
    hf.architectures = ["JambaForCausalLM"]
    hf.save_pretrained(tmp_path)
    model = ModelConfig(model=str(tmp_path), skip_tokenizer_init=True, dtype="bfloat16", model_impl="vllm")
    assert model.is_hybrid
    with pytest.raises(ValueError, match="lookahead: JambaForCausalLM is a hybrid model"):
        SpeculativeConfig(method="lookahead", target_model_config=model)


@pytest.mark.parametrize("chunked", [False, True])
def test_chunked_local_attention_runs_chains(monkeypatch: pytest.MonkeyPatch, chunked: bool):
    """Real attention layers on vLLM's Triton backend, one of them Llama 4's chunked local attention (its metadata
    splits requests into virtual batches the tree kernel does not read): the engine runs chains, saying why."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention, chunked_local_attention
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    from vllm_lookahead.backends import ChainBackend
    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.glue.engine import LookaheadEngine

    monkeypatch.setattr(chunked_local_attention, "get_attn_backend", lambda *a, **k: TritonAttentionBackend)
    cfg = VllmConfig()
    with set_current_vllm_config(cfg):
        Attention(4, 64, 0.125, num_kv_heads=2, cache_config=cfg.cache_config, prefix="model.layers.0.self_attn.attn",
                  attn_backend=TritonAttentionBackend)  # fmt: skip
        kind = chunked_local_attention.ChunkedLocalAttention if chunked else Attention
        extra = {"attention_chunk_size": 128} if chunked else {"attn_backend": TritonAttentionBackend}
        kind(num_heads=4, head_size=64, scale=0.125, num_kv_heads=2, cache_config=cfg.cache_config,
             prefix="model.layers.1.self_attn.attn", **extra)  # fmt: skip
    engine = LookaheadEngine(LookaheadParams(**SMALL_TREES), 512, backend=(CudaTreeBackend(), "trees"))
    engine.confirm_backend(SimpleNamespace(compilation_config=cfg.compilation_config))
    assert len(engine.layers) == 2
    if chunked:
        assert isinstance(engine.backend, ChainBackend)
        assert "model.layers.1.self_attn.attn runs chunked local attention (chunk 128)" in engine.backend_reason
    else:
        assert isinstance(engine.backend, CudaTreeBackend), engine.backend_reason


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@isolated
def test_recurrent_layers_are_refused_when_the_model_loads():
    """A real ShortConv (LFM2's recurrent layer, a vLLM `MambaBase`) among the model's layers: confirming the backend
    on the loaded model refuses it, naming the layer."""
    from transformers import Lfm2Config
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm.model_executor.layers.mamba.short_conv import ShortConv

    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.glue.engine import LookaheadEngine

    cfg = VllmConfig()
    with set_current_vllm_config(cfg):
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            backend="gloo",
        )  # fmt: skip
        parallel_state.initialize_model_parallel(1, 1)
        try:
            ShortConv(Lfm2Config(hidden_size=64, conv_L_cache=3, conv_bias=False), dim=64, layer_idx=0,
                      prefix="model.layers.0.conv")  # fmt: skip
        finally:
            parallel_state.destroy_model_parallel()
            parallel_state.destroy_distributed_environment()
    engine = LookaheadEngine(LookaheadParams(**SMALL_TREES), 512, backend=(CudaTreeBackend(), "trees"))
    with pytest.raises(ValueError, match=r"recurrent state \(model.layers.0.conv \(ShortConv\)\)"):
        engine.confirm_backend(SimpleNamespace(compilation_config=cfg.compilation_config))


# --- vLLM's Triton attention forward, patched, under the interpreter ------------------------------------------------

H, HKV, D, BLOCK = 9, 3, 64, 16  # the default model's heads (GQA 3), its head size
REQUESTS = [("plain", 1, 20), ("tree", 9, 21), ("plain", 5, 0), ("tree", 5, 16)]  # (kind, query tokens, cached)
PADDED = 4  # rows past the real tokens (vLLM pads a step to its CUDA graph's size)


@pytest.fixture(scope="module")
def vllm_triton(model_path: str) -> Iterator[SimpleNamespace]:
    """vLLM's Triton attention backend with its kernels interpreted (the CPU build's placeholders for triton and tl
    swapped for the real modules while its modules import), a real config of the default model in float16, and the
    plugin's patch of `TritonAttentionImpl.forward` applied to it, as the plugin applies it on CUDA."""
    import triton
    import triton.language as tl
    import vllm.triton_utils as tu
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    from vllm_lookahead.glue.patches import attention
    from vllm_lookahead.glue.patches.base import apply, revert

    cfg = EngineArgs(model=model_path, dtype="float16", max_model_len=512).create_engine_config()
    names = [n for n in sys.modules if n.startswith("vllm.v1.attention.ops") or n.endswith(".triton_attn")]
    saved_modules = {n: sys.modules.pop(n) for n in names}
    saved = (tu.triton, tu.tl, torch.cuda.get_device_capability)
    tu.triton, tu.tl = triton, tl
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # what vLLM's cache writer asks a GPU
    patch = [p for p in attention.PATCHES if p.name.startswith("triton_attn.")]
    on_cuda = current_platform.is_cuda
    try:
        triton_attn = importlib.import_module("vllm.v1.attention.backends.triton_attn")  # fresh, not the package's
        current_platform.is_cuda = lambda: True  # the plugin patches the CUDA backends on CUDA only
        try:
            apply(patch)
        finally:
            current_platform.is_cuda = on_cuda
        assert hasattr(triton_attn.TritonAttentionImpl.forward, "__wrapped__")
        yield SimpleNamespace(cfg=cfg, module=triton_attn)
    finally:
        revert(patch)
        tu.triton, tu.tl, torch.cuda.get_device_capability = saved
        for n in [n for n in sys.modules if n.startswith("vllm.v1.attention.ops") or n.endswith(".triton_attn")]:
            sys.modules.pop(n)
        sys.modules.update(saved_modules)


def _ancestor_mask(parents: list[int]) -> torch.Tensor:
    mask = torch.eye(len(parents), dtype=torch.bool)
    for u in range(1, len(parents)):
        mask[u, :u] = mask[parents[u], :u]
    return mask


@isolated
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # vLLM's kernel, its padding rows
@pytest.mark.parametrize("layout", ["LBNHC", "BLNHC", "LBHNC"])
def test_vllms_triton_forward_with_tree_rows(vllm_triton: SimpleNamespace, layout: str):
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.attention.attention import unified_attention_with_output, unified_kv_cache_update
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec
    from vllm.v1.worker.utils import allocate_kv_cache

    from vllm_lookahead.backends import TreeRows
    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend, split
    from vllm_lookahead.backends.cuda.reference import reference_tree_attention
    from vllm_lookahead.glue.step import LookaheadStep, forward_scope

    cfg, triton_attn = vllm_triton.cfg, vllm_triton.module
    cfg.cache_config.kv_cache_layout = layout
    names = [f"model.layers.{i}.{layout}.attn" for i in range(3)]
    with set_current_vllm_config(cfg):
        layers = [Attention(H, D, D**-0.5, num_kv_heads=HKV, cache_config=cfg.cache_config, prefix=n,
                            attn_backend=triton_attn.TritonAttentionBackend) for n in names]  # fmt: skip
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HKV, head_size=D, dtype=torch.float16)
    kv_config = get_kv_cache_config_from_groups(cfg, [KVCacheGroupSpec(names, spec)], spec.page_size_bytes * 3 * 12)
    caches = allocate_kv_cache(kv_config, torch.device("cpu"), cfg.cache_config.get_resolved_kv_cache_layout())
    assert len({c.untyped_storage().data_ptr() for c in caches.values()}) == 1  # one allocation for every layer
    gen = torch.Generator().manual_seed(len(layout))
    for layer in layers:
        layer.kv_cache = caches[layer.layer_name]
        layer.kv_cache.copy_(torch.randn(layer.kv_cache.shape, generator=gen).to(torch.float16))  # older tokens

    # the step: two trees beside a decoding and a prefilling request, every request in blocks of its own
    rng = random.Random(0)
    table = torch.zeros(len(REQUESTS), 4, dtype=torch.int32)
    qsl, seq_lens, slots, rows, block = [0], [], [], [], 1
    for i, (kind, n, cached) in enumerate(REQUESTS):
        seq_lens.append(n + cached)
        need = -(-(n + cached) // BLOCK)
        table[i, :need] = torch.arange(block, block + need)
        block += need
        if kind == "tree":
            mask = _ancestor_mask([-1] + [rng.randrange(u) for u in range(1, n)])
            rows.append(TreeRows(i, qsl[-1], n, n + cached, table[i].clone(), mask))
        slots += [int(table[i, p // BLOCK]) * BLOCK + p % BLOCK for p in range(cached, n + cached)]
        qsl.append(qsl[-1] + n)
    tokens = qsl[-1]
    slot_mapping = torch.tensor(slots + [-1] * PADDED, dtype=torch.int64)
    builder = triton_attn.TritonAttentionMetadataBuilder(spec, names, cfg, torch.device("cpu"))
    metadata = builder.build(0, CommonAttentionMetadata(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32), query_start_loc_cpu=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), num_reqs=len(REQUESTS), num_actual_tokens=tokens,
        max_query_len=max(r[1] for r in REQUESTS), max_seq_len=max(seq_lens), block_table_tensor=table,
        slot_mapping=slot_mapping, causal=True,
    ))  # fmt: skip
    backend = CudaTreeBackend()
    assert backend.check_layers(layers) is None  # vLLM's own impl, caches and heads
    qkvs = [torch.randn(tokens + PADDED, (H + 2 * HKV) * D, generator=gen).to(torch.float16) for _ in layers]

    def forward(step: LookaheadStep | None) -> list[torch.Tensor]:
        """Every layer as vLLM runs it: the step's K/V written, then attention into a poisoned, padded output."""
        outputs = []
        contexts = set_forward_context({n: metadata for n in names}, cfg, slot_mapping={n: slot_mapping for n in names})
        with contexts, forward_scope(step):
            for name, qkv in zip(names, qkvs, strict=True):
                q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)  # strided slices of one fused tensor
                q, k, v = q.view(-1, H, D), k.view(-1, HKV, D), v.view(-1, HKV, D)
                unified_kv_cache_update(k, v, name)
                out = torch.full((tokens + PADDED, H, D), float("nan"), dtype=torch.float16)
                unified_attention_with_output(q, k, v, out, name)
                outputs.append(out)
        return outputs

    before = {n: c.clone() for n, c in caches.items()}
    plain = forward(None)  # vLLM's own forward: no step
    for n, c in caches.items():
        c.copy_(before[n])
    step = LookaheadStep(proposed={}, backend=backend, attention_rows=rows)
    backend.prepare(rows, step.attention_plans)
    trees = forward(step)
    tree_rows = torch.zeros(tokens + PADDED, dtype=torch.bool)
    for r in rows:
        tree_rows[r.q_start : r.q_start + r.num_nodes] = True
    real = torch.arange(tokens + PADDED) < tokens
    for layer, qkv, mine, theirs in zip(layers, qkvs, trees, plain, strict=True):
        assert torch.equal(mine[real & ~tree_rows], theirs[real & ~tree_rows])  # vLLM's rows, bit for bit
        assert torch.isnan(mine[~real]).all()  # nothing written past the real tokens
        key_cache, value_cache = split(layer.kv_cache, D)
        ref = torch.full(mine.shape, float("nan"))
        reference_tree_attention(qkv[:, : H * D].view(-1, H, D), key_cache, value_cache, rows, D**-0.5, ref)
        for r in rows:
            sl = slice(r.q_start, r.q_start + r.num_nodes)
            err = ((mine[sl].float() - ref[sl]).norm() / ref[sl].norm()).item()
            assert err < 1.5e-3, (layer.layer_name, r.num_nodes, err)

    # accepted nodes' KV moved in every layer (overlapping moves read first), nothing else touched
    src = [int(table[1, (21 + u) // BLOCK]) * BLOCK + (21 + u) % BLOCK for u in (3, 5, 6)]
    dst = [int(table[1, (21 + d) // BLOCK]) * BLOCK + (21 + d) % BLOCK for d in (1, 2, 3)]
    cells = {n: c.transpose(1, 2).reshape(-1, HKV, 2 * D).clone() for n, c in caches.items()}
    backend.relocate(layers, src, dst)
    for n, c in caches.items():
        want = cells[n].clone()
        want[dst] = cells[n][src]
        assert torch.equal(c.transpose(1, 2).reshape(-1, HKV, 2 * D), want), (layout, n)


# --- the parent's delegate ----------------------------------------------------------------------------------------

_ISOLATED_TESTS = [n for n, f in list(globals().items()) if n.startswith("test_") and getattr(f, "_isolated", 0)]
if not ISOLATED:
    for _name in _ISOLATED_TESTS:
        del globals()[_name]

    def test_isolated_in_a_child_under_triton_interpreter():
        """The `isolated` tests, in a child pytest whose Triton loads with TRITON_INTERPRET=1."""
        run_in_interpreter(__file__, _ISOLATED_TESTS, timeout=600)
