"""Benchmark scripts loaded as modules by their path (they are scripts, not a package; nothing is put on sys.path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """The script at `relative` (from the repository root, e.g. "benchmarks/bench_methods.py"), imported once and
    kept in sys.modules (a dataclass of the script's resolves its module there)."""
    path = ROOT / relative
    name = f"bench_script_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
