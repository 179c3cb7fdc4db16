"""vLLM 0.32's paged KV cache on CPU (the CPU_ATTN backend): the one place that knows its layouts.

A layer's cache is [num_blocks, num_kv_heads, block_size, 2 * head_size]; vLLM views it as
[num_blocks, num_kv_heads, 2 * block_size, head_size] and splits it into key and value halves (`split`). Each
(block, KV head) half is a region of block_size * head_size elements whose order depends on vLLM's attention ISA
(`_get_attn_isa`). Where token t of the block (0 <= t < block_size) and dimension d (0 <= d < head_size) live in
that region, with p = 4 // element size (elements per 32-bit word: 2 for bfloat16, 1 for float32):
- "vec" and "vec16" (vec16 uses vec's writer): key d * block_size + t (stored [head_size, block_size]);
  value t * head_size + d (stored [block_size, head_size]);
- "amx" (bfloat16; block and head sizes multiples of 32, as vLLM picks it; at other head sizes vLLM's amx writer
  writes the vec layout): keys in groups of 16 tokens, each group [head_size / p, 16, p]
  (an AMX B tile: a row of 16 words per pair of dimensions):
  key (t // 16) * 16 * head_size + (d // p) * 16 * p + (t % 16) * p + d % p;
  values in groups of 16 dimensions, each group [block_size / p, 16, p] (pairs of tokens in a word):
  value (d // 16) * 16 * block_size + (t // p) * 16 * p + (d % 16) * p + t % p.
Readers and our own writer (`torch_writer`) work from those formulas alone (`Layout.offsets`), so every layout is
described once; the compiled kernel (csrc/tree_attention.cpp) gets a layout's `kernel_code`. `check_layout` proves a
layout against vLLM's own writer before use, so another vLLM release fails loudly instead of being misread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import torch

from vllm_lookahead.backends.base import CacheSpec

if TYPE_CHECKING:
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

Writer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
# (t [block_size, 1], d [1, head_size], block_size, head_size, p) -> offsets in a (block, head) region
Offsets = Callable[[torch.Tensor, torch.Tensor, int, int, int], torch.Tensor]

AMX_GROUP = 16  # an AMX tile row is 64 bytes = 16 words: keys grouped by 16 tokens, values by 16 dimensions


@dataclass(frozen=True)
class Layout:
    """One KV-cache layout: where vLLM's writer puts each (token, dimension) of a (block, KV head) region."""

    name: str
    kernel_code: int  # the compiled kernel's LAYOUT_* number (csrc/tree_attention.cpp)
    dtypes: tuple[torch.dtype, ...]  # the cache dtypes the tree path reads in this layout
    block_multiple: int  # block sizes must be a multiple of this (vLLM's own requirement)
    head_multiple: int
    key_at: Offsets
    value_at: Offsets
    # Whether a step with trees computes its other small requests' rows (decoding, chains) in the compiled kernel too
    # rather than beside it in vLLM's stock kernel (`plan.PLAIN_ROWS_IN_KERNEL`): where the kernel was measured faster.
    kernel_takes_plain_rows: bool = False

    def offsets(self, block_size: int, head_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[block_size, head_size] long each: the region offsets of token t's dimension d, for keys and values."""
        return _offsets(self, block_size, head_size, torch.empty((), dtype=dtype).element_size())

    def fits(self, dtype: torch.dtype, head_size: int, block_size: int) -> str | None:
        """None where this layout holds such a cache, else why not."""
        if dtype not in self.dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in self.dtypes)
            return f"the {dtype} KV cache in vLLM's {self.name!r} layout (the tree path reads {names} there)"
        if block_size % self.block_multiple or head_size % self.head_multiple:
            return f"block size {block_size} / head size {head_size} in vLLM's {self.name!r} layout"
        return None


@cache
def _offsets(layout: Layout, block_size: int, head_size: int, element_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.arange(block_size).unsqueeze(1)
    d = torch.arange(head_size).unsqueeze(0)
    p = 4 // element_size
    return layout.key_at(t, d, block_size, head_size, p), layout.value_at(t, d, block_size, head_size, p)


VEC = Layout(
    name="vec",
    kernel_code=0,
    dtypes=(torch.float32, torch.bfloat16),
    block_multiple=1,
    head_multiple=1,
    key_at=lambda t, d, bs, hs, p: d * bs + t,
    value_at=lambda t, d, bs, hs, p: t * hs + d,
    kernel_takes_plain_rows=True,
)
AMX = Layout(
    name="amx",
    kernel_code=1,
    dtypes=(torch.bfloat16,),  # vLLM picks amx for bfloat16 only
    block_multiple=2 * AMX_GROUP,
    head_multiple=2 * AMX_GROUP,  # vLLM picks vec16 for head sizes that are not multiples of 32
    key_at=lambda t, d, bs, hs, p: (
        (t // AMX_GROUP) * AMX_GROUP * hs + (d // p) * AMX_GROUP * p + (t % AMX_GROUP) * p + d % p
    ),
    value_at=lambda t, d, bs, hs, p: (
        (d // AMX_GROUP) * AMX_GROUP * bs + (t // p) * AMX_GROUP * p + (d % AMX_GROUP) * p + t % p
    ),
    kernel_takes_plain_rows=False,  # not measured against vLLM's AMX-tile kernel
)
LAYOUTS: dict[str, Layout] = {"vec": VEC, "vec16": VEC, "amx": AMX}  # vLLM ISA -> its cache layout
READABLE = tuple(LAYOUTS)  # the ISAs whose caches the tree path reads and writes
DTYPES = (torch.float32, torch.bfloat16)  # every dtype some layout holds
_layouts_checked: set[tuple[object, ...]] = set()


def layout_of(isa: str) -> Layout:
    found = LAYOUTS.get(isa)
    if found is None:
        raise ValueError(f"vllm-lookahead: no tree reader for vLLM's {isa!r} KV-cache layout")
    return found


def readable(isa: str | None, dtype: torch.dtype, head_size: int, block_size: int) -> bool:
    """Whether the tree path reads (and writes) an unquantized cache of vLLM's `isa` with this dtype and shape."""
    return isa in LAYOUTS and LAYOUTS[isa].fits(dtype, head_size, block_size) is None


def unsupported(spec: CacheSpec) -> str | None:
    """None where the tree path reads and writes this cache, proven against vLLM's own writer; else why not.

    At start-up vLLM's writer is asked for spec.layout: on the host that chose that layout it runs (vLLM writes
    with it; its amx writer is plain stores, in the AVX512-BF16 build vLLM loads on every AMX host). Where it cannot
    run (a spec for another host, e.g. amx asked of vLLM's AVX2 or AVX-512 build, which have no amx writer: vLLM
    never picks amx there), our own writer stands in; `ensure_layout` checks the layer's own writer at the first
    step anyway."""
    if spec.layout not in LAYOUTS:
        return f"no tree reader for vLLM's {spec.layout!r} KV-cache layout"
    if spec.kv_cache_dtype != "auto":
        return f"a quantized KV cache ({spec.kv_cache_dtype})"
    why = LAYOUTS[spec.layout].fits(spec.dtype, spec.head_size, spec.block_size)
    if why is not None:
        return why
    write = vllm_writer(spec.layout)
    if not writer_runs(write, spec.dtype, spec.head_size, spec.block_size):
        write = torch_writer(spec.layout)
    try:
        check_layout(write, spec.layout, spec.dtype, 2, spec.head_size, spec.block_size)
    except RuntimeError as e:
        return str(e)
    return None


def split(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value halves of a layer's cache, each [num_blocks, num_kv_heads, block_size, head_size]
    (the backend's own views; each (block, head) region is in the layout's order, not [block_size, head_size])."""
    num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
    key_cache, value_cache = kv_cache.view(num_blocks, num_kv_heads, 2 * block_size, -1).chunk(2, dim=2)
    return key_cache, value_cache


def _regions(cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, num_kv_heads, block_size * head_size]: each (block, head) region flat (a view)."""
    return cache.view(cache.shape[0], cache.shape[1], -1)


def gather_kv(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_ids: torch.Tensor, seq_len: int, isa: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first seq_len tokens' K and V of one request as [num_kv_heads, seq_len, head_size] each."""
    _, num_kv_heads, block_size, head_size = value_cache.shape
    koff, voff = layout_of(isa).offsets(block_size, head_size, value_cache.dtype)
    nblk = (seq_len + block_size - 1) // block_size
    ids = block_ids[:nblk].long()

    def read(cache: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
        x = _regions(cache)[ids].index_select(2, off.flatten())  # [nblk, H, block_size * head_size], token-major
        return x.view(nblk, num_kv_heads, block_size, head_size).transpose(0, 1).reshape(num_kv_heads, -1, head_size)

    return read(key_cache, koff)[:, :seq_len], read(value_cache, voff)[:, :seq_len]


def read_slots(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_ids: torch.Tensor, slots: torch.Tensor, isa: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V at token offsets `slots` (long) through `block_ids`, as [len(slots), num_kv_heads, D] each."""
    block_size = value_cache.shape[2]
    return _read(key_cache, value_cache, block_ids.long()[slots // block_size], slots % block_size, isa)


def read_cache_slots(
    key_cache: torch.Tensor, value_cache: torch.Tensor, slots: torch.Tensor, isa: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V at global cache slots (block * block_size + offset, vLLM's slot mapping), [len(slots), H, D] each."""
    block_size = value_cache.shape[2]
    return _read(key_cache, value_cache, slots // block_size, slots % block_size, isa)


def _read(
    key_cache: torch.Tensor, value_cache: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor, isa: str
) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, block_size, head_size = key_cache.shape
    koff, voff = layout_of(isa).offsets(block_size, head_size, key_cache.dtype)
    b = blocks.unsqueeze(1)
    # the tokens' own elements only, not whole blocks: [m, D, H] (indices around a slice go first), then [m, H, D]
    k = _regions(key_cache)[b, :, koff[offsets]].transpose(1, 2)
    v = _regions(value_cache)[b, :, voff[offsets]].transpose(1, 2)
    return k.contiguous(), v.contiguous()


def torch_writer(isa: str) -> Writer:
    """Our own cache writer for `isa`'s layout, byte for byte vLLM's `cpu_attn_reshape_and_cache` with an
    unquantized cache (negative slots skipped, as vLLM's): writer(key, value, key_cache, value_cache, slot_mapping).
    For hosts whose vLLM build cannot write that layout, and for tests."""
    layout = layout_of(isa)

    def write(k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor) -> None:
        _, _, block_size, head_size = kc.shape
        koff, voff = layout.offsets(block_size, head_size, kc.dtype)
        keep = slots >= 0
        slots, k, v = slots[keep], k[keep], v[keep]
        b = (slots // block_size).unsqueeze(1)
        off = slots % block_size
        _regions(kc)[b, :, koff[off]] = k.to(kc.dtype).transpose(1, 2)
        _regions(vc)[b, :, voff[off]] = v.to(vc.dtype).transpose(1, 2)

    return write


def vllm_writer(isa: str, kv_cache_dtype: str = "auto", k_scale: float = 1.0, v_scale: float = 1.0) -> Writer:
    """vLLM's own cache writer for this ISA: writer(key, value, key_cache, value_cache, slot_mapping)."""
    import vllm._custom_ops as ops

    def write(k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor) -> None:
        ops.cpu_attn_reshape_and_cache(k, v, kc, vc, slots, isa, k_scale, v_scale, kv_cache_dtype)

    return write


def writer_runs(write: Writer, dtype: torch.dtype, head_size: int, block_size: int) -> bool:
    """Whether `write` runs here at all (vLLM's x86 builds for hosts without AVX512-BF16 have no amx writer: it
    raises). Its output is not looked at: that is `check_layout`'s job."""
    kc, vc = split(torch.zeros(1, 1, block_size, 2 * head_size, dtype=dtype))
    one = torch.zeros(1, 1, head_size, dtype=dtype)
    try:
        write(one, one, kc, vc, torch.zeros(1, dtype=torch.long))
    except RuntimeError:
        return False
    return True


def layer_writer(layer: Attention) -> Writer:
    """The writer vLLM uses for this attention layer's cache."""
    return vllm_writer(layer.isa, layer.impl.kv_cache_dtype, layer._k_scale_float, layer._v_scale_float)


def check_layout(
    write: Writer, isa: str, dtype: torch.dtype, num_kv_heads: int, head_size: int, block_size: int
) -> None:
    """Write random K/V with `write`; RuntimeError unless the cache is, byte for byte, what our own writer makes
    of them and our readers read them back."""
    nb = 3
    kv = torch.zeros(nb, num_kv_heads, block_size, 2 * head_size, dtype=dtype)
    ours = torch.zeros_like(kv)
    n = 2 * block_size + 3  # the last block partly filled
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
    value = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
    block_ids = torch.tensor([2, 0, 1], dtype=torch.int32)
    slots = block_ids.long()[torch.arange(n) // block_size] * block_size + torch.arange(n) % block_size
    write(key, value, *split(kv), slots)
    torch_writer(isa)(key, value, *split(ours), slots)
    kc, vc = split(kv)
    k, v = gather_kv(kc, vc, block_ids, n, isa)
    picked = torch.tensor([0, 5, n - 1])
    rk, rv = read_slots(kc, vc, block_ids, picked, isa)
    ok = (
        same_bytes(kv, ours)
        and torch.equal(k, key.transpose(0, 1))
        and torch.equal(v, value.transpose(0, 1))
        and torch.equal(rk, key[picked])
        and torch.equal(rv, value[picked])
    )
    if not ok:
        raise RuntimeError(
            f"vllm-lookahead: this vLLM build's CPU attention KV-cache layout ({isa!r}, dtype={dtype}, "
            f"head_size={head_size}, block_size={block_size}) is not the one the lookahead attention path reads; "
            "lookahead cannot run trees here."
        )


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (torch.equal calls -0.0 and 0.0 equal and NaN unequal to itself)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def ensure_layout(layer: Attention, impl: CPUAttentionBackendImpl, kv_cache: torch.Tensor) -> None:
    """`check_layout` once per cache shape, dtype and ISA, with the layer's own writer."""
    _, num_kv_heads, block_size, two_d = kv_cache.shape
    key = (layer.isa, kv_cache.dtype, num_kv_heads, block_size, two_d, impl.kv_cache_dtype)
    if key not in _layouts_checked:
        check_layout(layer_writer(layer), layer.isa, kv_cache.dtype, num_kv_heads, two_d // 2, block_size)
        _layouts_checked.add(key)
