"""Lookahead Decoding for vLLM: a draft-free speculative method, one target forward pass per step."""

__version__ = "0.1.0"

# The one vLLM release whose internals the patches were written against.
SUPPORTED_VLLM_VERSION = "0.32.0"
