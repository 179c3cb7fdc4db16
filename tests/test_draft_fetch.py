"""`benchmarks/draft_fetch.py`: the engine core's fetch of drafts timed in multiprocess engines, run whole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import their siblings

from draft_fetch import parse_args  # noqa: E402

pytestmark = pytest.mark.engine


def test_only_speculative_methods_are_taken():
    with pytest.raises(SystemExit):
        parse_args(["--methods", "none"])
    assert parse_args(["--methods", "ngram,lookahead"]).method_list == ["ngram", "lookahead"]


def test_vllms_fetch_is_timed_and_lookahead_skips_it():
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "draft_fetch.py"), "--methods", "ngram,lookahead",
        "--dataset", "humaneval", "--num-prompts", "2", "--max-tokens", "8", "--concurrency", "2",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:6] for line in done.stdout.splitlines() if "| " in line}
    steps, _, fetches, _ = (c.strip() for c in rows["ngram"])
    assert int(steps) > 0 and int(fetches) > 0  # vLLM's path: one fetch a step
    steps, _, fetches, fetch_ms = (c.strip() for c in rows["lookahead"])
    assert int(steps) > 0 and fetches == "0" and fetch_ms == "-"  # the drafts came with the model output
