"""One lookahead step through the CUDA backend's path, without vLLM's runner: the tree positions written, the
kernel descriptors prepared, every layer's attention, verification (greedy or sampled) and the KV moves, on trees
of a chosen count and size. The host-sync test runs it on CPU tensors (`tests/test_cuda_step_syncs.py`), the GPU
diagnostics on a GPU under `torch.cuda.set_sync_debug_mode` (`benchmarks/diagnostics/gpu_glue.py`).

What stands in for vLLM: the runner's fields the glue reads (its input batch, positions, query start locations),
vLLM's forward of a layer (the tree rows are written over whatever it leaves), the attention layers (an impl named
as vLLM's Triton one, with its head counts and scale, over caches in vLLM's layout) and the x0 draws of vLLM's
sampler (each x0 row's argmax, taken on the device). Sampled trees draw through `sampler`'s `topk_topp_sampler`:
vLLM's own `TopKTopPSampler` where vLLM is installed (its `forward_native`, what a GPU without FlashInfer runs), else
a torch copy of it. Every tree accepts a path of `ACCEPTED` nodes that are not its first nodes (so KV moves), in
every configuration: the logits make the path's tokens the argmax (and, peaked, the draw) at its nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from vllm_lookahead.backends.cuda import relocation, tree_kernel
from vllm_lookahead.backends.cuda.backend import CudaTreeBackend
from vllm_lookahead.backends.staging import to_device
from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.core.tree import StepTree
from vllm_lookahead.glue.engine import LookaheadEngine
from vllm_lookahead.glue.step import LookaheadStep, StepResult

ACCEPTED = 4  # nodes of each tree's accepted path
VOCAB = 96
PEAK = 60.0  # logit of a row's chosen token above the others: the draw is the argmax
BLOCK_SIZE = 16


@dataclass
class Config:
    num_trees: int
    num_nodes: int
    sampled: bool = False
    device: str = "cpu"
    dtype: torch.dtype = torch.bfloat16
    num_layers: int = 2
    heads: tuple[int, int] = (4, 2)
    head_size: int = 64
    prefix: int = 20  # tokens cached before each tree's x0


def make_tree(num_nodes: int, seed: int) -> tuple[StepTree, list[int]]:
    """A tree of num_nodes nodes (at least ACCEPTED + 2) whose accepted path is not its first nodes: a decoy chain
    first, then the path, then leaves hanging off the path. Returns the tree and the argmax at each node (the path's
    next token on the path, a token no child carries elsewhere)."""
    decoy = max(1, (num_nodes - ACCEPTED - 1) // 3)
    tokens, parents, depths = [1], [-1], [0]
    for i in range(decoy):
        tokens.append(20 + i % 10)
        parents.append(len(tokens) - 2 if i else 0)
        depths.append(i + 1)
    path = []
    for d in range(ACCEPTED):
        tokens.append(40 + d)
        parents.append(path[-1] if path else 0)
        depths.append(d + 1)
        path.append(len(tokens) - 1)
    rng = np.random.default_rng(seed)
    while len(tokens) < num_nodes:
        at = int(rng.integers(0, ACCEPTED))
        tokens.append(60 + len(tokens) % 30)
        parents.append(path[at])
        depths.append(at + 2)
    argmax = [3] * num_nodes
    argmax[0] = 40
    for d, u in enumerate(path):
        argmax[u] = 40 + d + 1 if d + 1 < ACCEPTED else 7
    return StepTree(tokens=tokens, parents=parents, depths=depths), argmax


def torch_topk_topp_sampler(
    logits: torch.Tensor, generators: dict[int, torch.Generator], k: torch.Tensor | None, p: torch.Tensor | None
) -> tuple[torch.Tensor, None]:
    """vLLM's `TopKTopPSampler.forward_native` in torch, for a machine without vLLM: top-k and top-p masks by one
    sort, then an exponential race (each seeded row from its own generator), no host sync."""
    if k is not None or p is not None:
        sort, idx = logits.sort(dim=-1)
        if k is not None:
            cut = sort.gather(1, (sort.shape[1] - k.long()).unsqueeze(1))
            sort.masked_fill_(sort < cut, -float("inf"))
        if p is not None:
            probs = sort.softmax(dim=-1)
            mask = probs.cumsum(dim=-1) <= 1 - p.unsqueeze(1)
            mask[:, -1] = False
            sort.masked_fill_(mask, -float("inf"))
        logits = logits.scatter(-1, idx, sort)
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs)
    q.exponential_()
    for i, gen in generators.items():
        q[i].exponential_(generator=gen)
    return probs.div_(q).argmax(dim=-1).view(-1), None


def make_sampler() -> Any:
    """vLLM's TopKTopPSampler running its GPU path where vLLM is installed, else `torch_topk_topp_sampler`."""
    try:
        from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler
    except ImportError:
        return SimpleNamespace(topk_topp_sampler=torch_topk_topp_sampler)
    sampler = TopKTopPSampler()
    sampler.forward = sampler.forward_native
    return SimpleNamespace(topk_topp_sampler=sampler)


@dataclass
class Rig:
    """A configuration's runner stand-in, engine, layers and trees; `step` runs one step on them."""

    config: Config
    runner: Any
    engine: LookaheadEngine
    layers: list[Any]
    trees: dict[str, StepTree]
    logits: torch.Tensor
    query: torch.Tensor
    block_table: torch.Tensor
    outputs: list[list[int]] = field(default_factory=list)


def make_rig(config: Config, wrap: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> Rig:
    """Everything one step reads. `wrap` turns each tensor that lives on the device in vLLM (positions, logits,
    caches, the block table, the sampling tensors) into what the caller wants (the sync test's marked tensors)."""
    device = torch.device(config.device)
    n, t = config.num_nodes, config.num_trees
    heads, kv_heads = config.heads
    d = config.head_size
    per_req_blocks = -(-(config.prefix + n) // BLOCK_SIZE)
    num_blocks = t * per_req_blocks + 1
    table = torch.arange(1, num_blocks, dtype=torch.int32).view(t, per_req_blocks)
    trees, argmax = {}, []
    for i in range(t):
        tree, am = make_tree(n, i)
        trees[f"r{i}"] = tree
        argmax += am
    logits = torch.zeros(t * n, VOCAB, dtype=torch.float32)
    logits[torch.arange(t * n), torch.tensor(argmax)] = PEAK
    computed = np.full(t, config.prefix, dtype=np.int64)
    token_ids = np.zeros((t, config.prefix + n + 1), dtype=np.int64)
    token_ids[:, config.prefix] = 1  # every tree's x0
    qsl = np.arange(t + 1, dtype=np.int64) * n
    cpu_table = SimpleNamespace(get_cpu_tensor=lambda: table, block_size=BLOCK_SIZE)
    generators = {i: torch.Generator(device=device).manual_seed(i) for i in range(0, t, 2)} if config.sampled else {}
    md = SimpleNamespace(
        all_greedy=not config.sampled,
        temperature=wrap(torch.ones(t, device=device)) if config.sampled else None,
        top_k=wrap(torch.full((t,), 20, dtype=torch.int32, device=device)) if config.sampled else None,
        top_p=wrap(torch.full((t,), 0.95, device=device)) if config.sampled else None,
        generators=generators,
        logitsprocs=SimpleNamespace(argmax_invariant=[]),
    )
    batch = SimpleNamespace(
        req_id_to_index={f"r{i}": i for i in range(t)},
        num_computed_tokens_cpu=computed,
        token_ids_cpu=token_ids,
        block_table=[cpu_table],
        sampling_metadata=md,
        temperature_cpu=np.full(t, 1.0 if config.sampled else 0.0, dtype=np.float32),
        num_reqs=t,
    )
    runner = SimpleNamespace(
        input_batch=batch,
        query_start_loc=SimpleNamespace(np=qsl),
        positions=wrap(torch.zeros(t * n + 8, dtype=torch.int64, device=device)),
        sampler=make_sampler(),
        requests={},
        use_async_scheduling=False,
    )
    params = LookaheadParams(recycle_candidates=8)
    engine = LookaheadEngine(params, 4096, backend=(CudaTreeBackend(), "trees through the cuda backend"))
    engine.verification._recycles = lambda s: True  # type: ignore[method-assign]  # read the recycling top-k too
    impl_cls = type("TritonAttentionImpl", (), {})
    layers = []
    for i in range(config.num_layers):
        impl = impl_cls()
        impl.num_heads, impl.num_kv_heads, impl.head_size, impl.scale = heads, kv_heads, d, d**-0.5
        impl.sliding_window = impl.alibi_slopes = impl.sinks = impl.logits_soft_cap = None
        kv = torch.zeros(num_blocks, BLOCK_SIZE, kv_heads, 2 * d, dtype=config.dtype, device=device).transpose(1, 2)
        layers.append(SimpleNamespace(impl=impl, kv_cache=wrap(kv), layer_name=f"model.layers.{i}.self_attn.attn"))
    assert engine.backend.check_layers(layers) is None
    engine.layers = layers
    query = wrap(torch.randn(t * n, heads, d, device=device).to(config.dtype))
    return Rig(config, runner, engine, layers, trees, wrap(logits.to(device)), query, wrap(table.to(device)))


def vllm_forward_stand_in(impl: Any, layer: Any, query: torch.Tensor, key: Any, value: Any, kv_cache: torch.Tensor,
                          attn_metadata: Any, output: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """vLLM's forward of a layer: the tree kernel writes the tree rows over whatever it leaves."""
    return output


def step(rig: Rig) -> torch.Tensor:
    """One step: drafts scheduled, positions and descriptors, every layer's attention, verification and KV moves.
    Returns the step's sampler output on the device (each request's tokens, then -1: `outputs` reads it)."""
    engine, runner, config = rig.engine, rig.runner, rig.config
    engine.pending = LookaheadStep(proposed=dict(rig.trees), backend=engine.backend)
    total = config.num_trees * config.num_nodes
    scheduled = SimpleNamespace(
        scheduled_spec_decode_tokens={r: t.tokens[1:] for r, t in rig.trees.items()}, total_num_scheduled_tokens=total
    )
    engine.begin_step(runner, scheduled)
    current = engine.step
    assert current is not None and len(current.attention_rows) == config.num_trees
    md = SimpleNamespace(block_table=rig.block_table)
    for layer in rig.layers:
        output = torch.empty_like(rig.query)
        current.backend.attend(current.attention_rows, current.attention_plans, vllm_forward_stand_in, layer.impl,
                               layer, rig.query, None, None, layer.kv_cache, md, output)  # fmt: skip
    first_rows = [i * config.num_nodes for i in range(config.num_trees)]
    device = rig.logits.device
    sampled = torch.full((config.num_trees, config.num_nodes), -1, dtype=torch.int32, device=device)
    if config.sampled:  # vLLM's sampler's x0 draws (the peaked rows' argmax), made on the device
        sampled[:, 0] = rig.logits.index_select(0, to_device(first_rows, torch.int64, device)).argmax(-1).int()
    result = StepResult(
        logits=rig.logits,
        spec_md=SimpleNamespace(num_draft_tokens=[config.num_nodes - 1] * config.num_trees),
        sampler_output=SimpleNamespace(sampled_token_ids=sampled),
        first_rows=first_rows,
        first_rows_sampled=True,
        x0_is_argmax=not config.sampled,
    )
    engine.verification.verify(runner, current, result, rig.layers)
    engine.step = None
    return sampled


def outputs(sampled: torch.Tensor) -> list[list[int]]:
    """Each request's output tokens of a step (`step`'s result)."""
    return [[t for t in row if t >= 0] for row in sampled.tolist()]


@contextmanager
def kernels_recorded() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """The Triton launches of the tree kernel, its merge and the KV moves recorded (name and constexprs) instead of
    run: the host's part of a step alone."""
    launched: list[tuple[str, dict[str, Any]]] = []
    saved = (tree_kernel._tree_attention_kernel, tree_kernel._combine_splits_kernel, relocation._copy_cells)

    def recorder(name: str) -> Any:
        class Launcher:
            def __getitem__(self, grid: Any) -> Callable[..., None]:
                return lambda *args, **kwargs: launched.append((name, kwargs))

        return Launcher()

    tree_kernel._tree_attention_kernel = recorder("tree")
    tree_kernel._combine_splits_kernel = recorder("merge")
    relocation._copy_cells = recorder("moves")
    try:
        yield launched
    finally:
        tree_kernel._tree_attention_kernel, tree_kernel._combine_splits_kernel, relocation._copy_cells = saved
