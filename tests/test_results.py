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


def test_a_missing_results_folder_is_created(tmp_path):
    out = tmp_path / "new" / "deeper" / "r.jsonl"
    _results.append_jsonl(out, {}, [{"a": 1}, {"a": 2}])
    assert [json.loads(line)["a"] for line in out.read_text().splitlines()] == [1, 2]
