"""Where the package keeps what it prepares or builds (models, compiled kernels)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$VLLM_LOOKAHEAD_CACHE, else $XDG_CACHE_HOME/vllm-lookahead (~/.cache/vllm-lookahead)."""
    if env := os.environ.get("VLLM_LOOKAHEAD_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vllm-lookahead"
