"""The lookahead engine of the step being run, for the attention path to find (one worker process, one step
at a time, like vLLM's own forward context). `active` is None outside lookahead steps."""

from __future__ import annotations

from typing import Any

from vllm_lookahead.tree_attention import TreeSpan

active: Any = None  # the LookaheadEngine whose plan the current forward pass carries
_spans_key: tuple[int, int] | None = None
_spans: list[TreeSpan] = []
_layouts_checked: set[tuple[Any, ...]] = set()


def spans_for(engine: Any, attn_metadata: Any) -> list[TreeSpan]:
    """The plan's tree requests as TreeSpans for this metadata (built once per step, shared by all layers)."""
    global _spans_key, _spans
    key = (id(engine.plan), id(attn_metadata))
    if key != _spans_key:
        seq_lens = attn_metadata.seq_lens.tolist()
        block_table = attn_metadata.block_table
        _spans = [
            TreeSpan(
                q_start=e.q_start,
                num_nodes=e.tree.num_nodes,
                seq_len=int(seq_lens[e.req_index]),
                block_ids=block_table[e.req_index],
                mask=e.mask,
            )
            for e in engine.plan
            if e.mask is not None
        ]
        _spans_key = key
    return _spans


def ensure_layout(layer: Any, impl: Any, kv_cache: Any) -> None:
    """Prove once per cache shape that the tree path reads vLLM's KV layout right; raise if not."""
    from vllm_lookahead.tree_attention import check_cache_layout

    _, num_kv_heads, block_size, two_d = kv_cache.shape
    key = (layer.isa, kv_cache.dtype, num_kv_heads, block_size, two_d, impl.kv_cache_dtype)
    if key in _layouts_checked:
        return
    import vllm._custom_ops as ops

    def write(k, v, kc, vc, slots):
        ops.cpu_attn_reshape_and_cache(k, v, kc, vc, slots, layer.isa, kv_cache_dtype=impl.kv_cache_dtype)

    check_cache_layout(write, kv_cache.dtype, num_kv_heads, two_d // 2, block_size)
    _layouts_checked.add(key)
