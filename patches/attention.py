"""CPU attention: recompute the attention of lookahead tree tokens with the tree mask.

The stock kernel (`cpu_attention_with_kv_cache`) has no arbitrary mask, so it first runs on the whole batch
as usual (plain requests and every x0 row are right), and then the rows of each lookahead tree are
overwritten by `tree_attention.apply_tree_attention`: the whole cached prefix plus the node's ancestors.
A pass-through when no tree is planned for the step (every run without lookahead).
"""

from __future__ import annotations

from patches import Patch


def _owner():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    return CPUAttentionBackendImpl


def _forward(original):
    from vllm_lookahead import step_context

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        result = original(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        engine = step_context.active
        if engine is None or not engine.plan or attn_metadata is None:
            return result
        from vllm.v1.attention.backend import AttentionType

        if self.attn_type != AttentionType.DECODER:
            return result
        from vllm_lookahead.tree_attention import apply_tree_attention

        spans = step_context.spans_for(engine, attn_metadata)
        if spans:
            step_context.ensure_layout(layer, self, kv_cache)
            num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
            key_cache, value_cache = kv_cache.view(num_blocks, num_kv_heads, 2 * block_size, -1).chunk(
                2, dim=2
            )
            apply_tree_attention(query, key_cache, value_cache, output, spans, self.scale)
        return result

    return forward


PATCHES = [Patch("cpu_attn.CPUAttentionBackendImpl.forward", _owner, "forward", _forward)]
