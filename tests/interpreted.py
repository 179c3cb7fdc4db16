"""Tests that launch Triton kernels on a CPU run in a child pytest: Triton's interpreter (TRITON_INTERPRET=1) must be
set before Triton is first imported, which in the parent has long happened."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_in_interpreter(test_file: str, names: list[str], timeout: int) -> None:
    """Run these tests of `test_file` in a child pytest under TRITON_INTERPRET=1; each must pass, none be skipped."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        str(Path(test_file)),
        "-k",
        " or ".join(names),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= len(names), proc.stdout[-2000:]
    assert "skipped" not in proc.stdout, proc.stdout[-2000:]
