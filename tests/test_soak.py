"""The short serving soak (`benchmarks/soak_serve.py`, whose long run is a benchmark): `vllm serve` with lookahead
under 10 concurrent clients for 30 seconds, one a kind of request (so every kind is sent at once, however slow the
machine), no errors besides the deliberate aborts, no lookahead state left at the end, and the engine's memory growing
no more than plain decoding's under the same mix (which runs next)."""

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
    cmd = [sys.executable, str(SOAK), "--duration", "30", "--clients", "10", "--json", str(report_path)]
    proc = subprocess.run([*cmd, "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    print(proc.stdout)
    la, plain = report["lookahead"], report["plain"]
    assert la["errors"] == 0, la["error_samples"]
    assert plain["errors"] == 0, plain["error_samples"]
    assert la["live_states_end"] == 0
    growth = (la["rss_mb_end"] - la["rss_mb_warm"]) - (plain["rss_mb_end"] - plain["rss_mb_warm"])
    assert growth == report["excess_growth_mb"] <= report["rss_bound_mb"]
    assert report["ok"] and proc.returncode == 0
    # The mix ran: every kind of request was served, and some streams were dropped by their client.
    from tests.scripts import load_script

    assert set(la["served"]) == set(load_script("benchmarks/soak_serve.py").KINDS) - {"abort-mid-stream"}
    assert la["aborted"] > 0 and max(s["live_states"] for s in la["samples"]) > 0
    # the engine's shared suffix tree holds the outputs, and the report says how many tokens
    assert la["suffix_cached_tokens_end"] > 0 and plain["suffix_cached_tokens_end"] is None
    assert (tmp_path / "soak_c10_d30.png").exists()
