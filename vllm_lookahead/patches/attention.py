"""CPU attention: a lookahead step's tree rows get tree-masked attention (`attention_path.forward` decides how).

The stock kernel (`cpu_attention_with_kv_cache`) has no arbitrary mask. A pass-through outside lookahead steps
(every run without lookahead).
"""

from __future__ import annotations

from vllm_lookahead import attention_path
from vllm_lookahead.patches.base import Patch


def _owner():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    return CPUAttentionBackendImpl


def _forward(original):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        return attention_path.forward(original, self, layer, query, key, value, kv_cache, attn_metadata, output,
                                      *args, **kwargs)  # fmt: skip

    return forward


PATCHES = [Patch("cpu_attn.CPUAttentionBackendImpl.forward", _owner, "forward", _forward)]
