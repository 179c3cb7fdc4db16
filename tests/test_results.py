"""Benchmark result files (`benchmarks/_results.py`): they get committed, so they carry no home directory."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import _results


def test_the_home_directory_is_written_as_a_tilde(tmp_path, monkeypatch):
    monkeypatch.setattr(_results.Path, "home", lambda: Path("/home/someone"))
    out = tmp_path / "r.jsonl"
    _results.append_jsonl(out, {"model": "/home/someone/.cache/m", "other": "/home/someone-else/m"}, [{"a": 1}])
    row = json.loads(out.read_text())
    assert row["settings"] == {"model": "~/.cache/m", "other": "/home/someone-else/m"} and row["a"] == 1
