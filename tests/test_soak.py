"""The short serving soak (`benchmarks/soak_serve.py`, whose long run is a benchmark): `vllm serve` with lookahead
under 8 concurrent clients for a minute, every kind of request in the mix, no errors besides the deliberate aborts,
no lookahead state left at the end, and the engine's memory flat after warm-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

SOAK = Path(__file__).resolve().parents[1] / "benchmarks" / "soak_serve.py"


def test_short_serving_soak(tmp_path):
    report_path = tmp_path / "soak.json"
    cmd = [sys.executable, str(SOAK), "--duration", "60", "--clients", "8", "--json", str(report_path)]
    proc = subprocess.run([*cmd, "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    print(proc.stdout)
    assert report["errors"] == 0, report["error_samples"]
    assert report["live_states_end"] == 0
    assert report["rss_mb_end"] - report["rss_mb_warm"] <= report["rss_bound_mb"]
    assert report["ok"] and proc.returncode == 0
    # The mix ran: every kind of request was served, and some streams were dropped by their client.
    from benchmarks.soak_serve import KINDS

    assert set(report["served"]) == set(KINDS) - {"abort-mid-stream"}
    assert report["aborted"] > 0
    assert (tmp_path / "soak_c8_d60.png").exists()
