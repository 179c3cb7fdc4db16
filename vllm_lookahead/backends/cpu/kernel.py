"""Building the compiled CPU library: the C++ in csrc/ (the tree-attention kernel and the KV moves,
`tree_attention.cpp`; the logits rows' top entries, `row_select.cpp`) compiled with the system C++ compiler into one
shared library, which `library.py` loads and wraps.

The sources have no torch headers, so it builds in a few seconds with `g++ -O3 -fopenmp`; the shared library is
cached on disk keyed by source, compiler and flags, so a CPU-specific build is never reused on another CPU. `make`
set-up builds it (`python -m vllm_lookahead.backends.cpu.kernel`); otherwise the first lookahead engine does. Its
OpenMP calls bind to the runtime the process already has (vLLM preloads torch's libgomp or Intel's libiomp5, which
exports the same entry points), so it shares torch's threads. `CXX` names the compiler (default `g++`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from vllm_lookahead.cache import cache_root

CSRC = Path(__file__).with_name("csrc")
SOURCES = (CSRC / "tree_attention.cpp", CSRC / "row_select.cpp")
HEADERS = (CSRC / "vectors.h",)  # included by the sources: part of the build's cache key
BASE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno", "-ffp-contract=fast")


def isa_flags() -> tuple[str, ...]:
    """The widest vector ISA this CPU has that the source is written for (no -march=native: the cache is keyed)."""
    if torch.cpu._is_avx512_supported():
        return ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma")
    if torch.cpu._is_avx2_supported():
        return ("-mavx2", "-mfma", "-mf16c")
    return ()


def cache_dir() -> Path:
    """Built libraries live next to the prepared models: $VLLM_LOOKAHEAD_CACHE/kernels."""
    return cache_root() / "kernels"


def compiler() -> str | None:
    """The C++ compiler a build uses: `CXX` (a build tool's usual variable), else g++; None where there is none."""
    return shutil.which(os.environ.get("CXX", "g++"))


def build() -> Path:
    """Compile the library unless a build of these sources with these flags is cached; the library's path."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX or install g++)")
    flags = (*BASE_FLAGS, *isa_flags())
    source = b"".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    key = hashlib.sha256(source + " ".join((cxx, *flags)).encode()).hexdigest()[:16]
    out_dir = cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / f"tree_attention_{key}.so"
    if not lib.exists():
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
        os.close(fd)
        try:
            subprocess.run([cxx, *flags, *map(str, SOURCES), "-o", tmp], check=True, capture_output=True, text=True)
            os.replace(tmp, lib)  # atomic: workers building at once race harmlessly
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"building the compiled CPU library failed:\n{e.stderr}") from e
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return lib


def main() -> int:
    """Build (or find cached) and print the library's path. Without a compiler: a notice, and success (the plugin
    then uses the plain-torch path); a compiler that fails: an error."""
    if compiler() is None:
        print("no C++ compiler: lookahead's tree rows will use the plain-torch path (install g++ for the kernel)")
        return 0
    try:
        path = build()
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
