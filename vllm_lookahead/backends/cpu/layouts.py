"""vLLM's paged KV cache on CPU (the CPU_ATTN backend's "vec" layout): the one place that knows its layout.

A layer's cache is [num_blocks, num_kv_heads, block_size, 2 * head_size]; vLLM views it as
[num_blocks, num_kv_heads, 2 * block_size, head_size] and splits it into key and value halves (`split`). Per block
and KV head, keys are stored transposed as [head_size, block_size] in the memory of a [block_size, head_size] view,
values as [block_size, head_size]. `check_layout` proves that against vLLM's own writer before any use, so another
ISA or vLLM release fails loudly instead of being misread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from vllm_lookahead.backends.base import CacheSpec

if TYPE_CHECKING:
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

Writer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
# The ISAs whose layout this module reads and writes (keys stored [head_size, block_size] per block and head).
READABLE = ("vec", "vec16")
DTYPES = (torch.float32, torch.bfloat16)
_layouts_checked: set[tuple[object, ...]] = set()


def unsupported(spec: CacheSpec) -> str | None:
    """None where the tree path reads and writes this cache, proven against vLLM's own writer; else why not."""
    if spec.layout not in READABLE:
        return f"no tree reader for vLLM's {spec.layout!r} KV-cache layout"
    if spec.kv_cache_dtype != "auto":
        return f"a quantized KV cache ({spec.kv_cache_dtype})"
    if spec.dtype not in DTYPES:
        return f"the {spec.dtype} KV cache (the tree path reads float32 and bfloat16)"
    try:
        check_layout(vllm_writer(spec.layout), spec.dtype, 2, spec.head_size, spec.block_size)
    except RuntimeError as e:
        return str(e)
    return None


def split(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value halves of a layer's cache, each [num_blocks, num_kv_heads, block_size, head_size]
    (the backend's own views; keys' memory holds [head_size, block_size] per block and head)."""
    num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
    key_cache, value_cache = kv_cache.view(num_blocks, num_kv_heads, 2 * block_size, -1).chunk(2, dim=2)
    return key_cache, value_cache


def gather_kv(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_ids: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first seq_len tokens' K and V of one request as [num_kv_heads, seq_len, head_size] each."""
    _, num_kv_heads, block_size, head_size = value_cache.shape
    nblk = (seq_len + block_size - 1) // block_size
    ids = block_ids[:nblk].long()
    k = key_cache[ids].reshape(nblk, num_kv_heads, head_size, block_size)
    k = k.permute(1, 0, 3, 2).reshape(num_kv_heads, nblk * block_size, head_size)[:, :seq_len]
    v = value_cache[ids].permute(1, 0, 2, 3).reshape(num_kv_heads, nblk * block_size, head_size)[:, :seq_len]
    return k, v


def read_slots(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_ids: torch.Tensor, slots: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V at token offsets `slots` (long) through `block_ids`, as [len(slots), num_kv_heads, D] each."""
    block_size = value_cache.shape[2]
    return _read(key_cache, value_cache, block_ids.long()[slots // block_size], slots % block_size)


def read_cache_slots(
    key_cache: torch.Tensor, value_cache: torch.Tensor, slots: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V at global cache slots (block * block_size + offset, vLLM's slot mapping), [len(slots), H, D] each."""
    block_size = value_cache.shape[2]
    return _read(key_cache, value_cache, slots // block_size, slots % block_size)


def _read(
    key_cache: torch.Tensor, value_cache: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    num_blocks, num_kv_heads, block_size, head_size = key_cache.shape
    # Keys' memory is [head_size, block_size] per block and head: pick the tokens' columns, not whole blocks.
    k = key_cache.view(num_blocks, num_kv_heads, head_size, block_size)[blocks, :, :, offsets]  # [m, H, D]
    v = value_cache[blocks, :, offsets]  # [m, H, D]
    return k.contiguous(), v.contiguous()


def vllm_writer(isa: str, kv_cache_dtype: str = "auto", k_scale: float = 1.0, v_scale: float = 1.0) -> Writer:
    """vLLM's own cache writer for this ISA: writer(key, value, key_cache, value_cache, slot_mapping)."""
    import vllm._custom_ops as ops

    def write(k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor) -> None:
        ops.cpu_attn_reshape_and_cache(k, v, kc, vc, slots, isa, k_scale, v_scale, kv_cache_dtype)

    return write


def layer_writer(layer: Attention) -> Writer:
    """The writer vLLM uses for this attention layer's cache."""
    return vllm_writer(layer.isa, layer.impl.kv_cache_dtype, layer._k_scale_float, layer._v_scale_float)


def check_layout(write: Writer, dtype: torch.dtype, num_kv_heads: int, head_size: int, block_size: int) -> None:
    """Write random K/V with `write` and read them back with gather_kv/read_slots; RuntimeError if they differ."""
    nb = 3
    kc, vc = split(torch.zeros(nb, num_kv_heads, block_size, 2 * head_size, dtype=dtype))
    n = 2 * block_size + 3
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
    value = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
    block_ids = torch.tensor([2, 0, 1], dtype=torch.int32)
    slots = block_ids.long()[torch.arange(n) // block_size] * block_size + torch.arange(n) % block_size
    write(key, value, kc, vc, slots)
    k, v = gather_kv(kc, vc, block_ids, n)
    picked = torch.tensor([0, 5, n - 1])
    rk, rv = read_slots(kc, vc, block_ids, picked)
    ok = (
        torch.equal(k, key.transpose(0, 1))
        and torch.equal(v, value.transpose(0, 1))
        and torch.equal(rk, key[picked])
        and torch.equal(rv, value[picked])
    )
    if not ok:
        raise RuntimeError(
            "vllm-lookahead: this vLLM build's CPU attention KV-cache layout is not the one the lookahead "
            f"attention path reads (dtype={dtype}, block_size={block_size}); lookahead cannot run here."
        )


def ensure_layout(layer: Attention, impl: CPUAttentionBackendImpl, kv_cache: torch.Tensor) -> None:
    """`check_layout` once per cache shape, dtype and ISA, with the layer's own writer."""
    _, num_kv_heads, block_size, two_d = kv_cache.shape
    key = (layer.isa, kv_cache.dtype, num_kv_heads, block_size, two_d, impl.kv_cache_dtype)
    if key not in _layouts_checked:
        check_layout(layer_writer(layer), kv_cache.dtype, num_kv_heads, two_d // 2, block_size)
        _layouts_checked.add(key)
