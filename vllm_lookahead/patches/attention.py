"""CPU attention: the rows of lookahead trees get tree-masked attention.

The stock kernel (`cpu_attention_with_kv_cache`) has no arbitrary mask, so it runs on the whole batch as usual
(plain requests and every x0 row are right), and then the tree rows of the step under way are overwritten by
`tree_attention.attend_layer`. A pass-through outside lookahead steps (every run without lookahead).
"""

from __future__ import annotations

from vllm_lookahead import step as lookahead_step
from vllm_lookahead import tree_attention
from vllm_lookahead.patches.base import Patch


def _owner():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    return CPUAttentionBackendImpl


def _forward(original):
    from vllm.v1.attention.backend import AttentionType

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        result = original(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        step = lookahead_step.current()
        if step is not None and step.attention_rows and attn_metadata is not None:
            if self.attn_type == AttentionType.DECODER:
                tree_attention.attend_layer(step.attention_rows, layer, self, query, kv_cache, output)
        return result

    return forward


PATCHES = [Patch("cpu_attn.CPUAttentionBackendImpl.forward", _owner, "forward", _forward)]
