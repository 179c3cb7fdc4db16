"""`benchmarks/_inprocess.py`'s timed generation, and `benchmarks/ab_sizing.py` run whole on the real engine."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import their siblings

from _inprocess import timed_generate  # noqa: E402

from vllm_lookahead.tools.prompts import humaneval_prompts  # noqa: E402


class _Recorder:
    """Stands in for vLLM's LLM: records each generate call's prompts and makes 3 tokens a prompt."""

    def __init__(self, events: list) -> None:
        self.events = events

    def generate(self, prompts: list[str], sp, use_tqdm: bool = False) -> list:  # noqa: ANN001
        self.events.append(("generate", list(prompts), sp.max_tokens, sp.temperature))
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1, 2, 3])]) for _ in prompts]


@pytest.mark.parametrize("concurrency", [1, 4])
def test_the_warm_up_uses_other_prompts_and_the_clock_starts_after_it(concurrency):
    events: list = []
    args = argparse.Namespace(dataset="humaneval", num_prompts=3, max_tokens=7)
    outs, seconds, tokens = timed_generate(_Recorder(events), args, concurrency, lambda: events.append("start"))
    texts = humaneval_prompts(3 + max(concurrency, 2))
    warm, *rest = events
    assert warm[0] == "generate" and warm[1] == texts[3:]  # the warm-up: none of the measured prompts
    assert rest[0] == "start"  # on_start runs between the warm-up and the measured prompts
    measured = [e[1] for e in rest[1:]]
    # one prompt a call at concurrency 1 (each request alone), all at once otherwise
    assert measured == ([[t] for t in texts[:3]] if concurrency == 1 else [texts[:3]])
    assert all(e[2:] == (7, 0.0) for e in [warm, *rest[1:]])  # greedy, --max-tokens each
    assert len(outs) == 3 and tokens == 9 and seconds >= 0


def test_the_sampling_flags_reach_the_measured_requests():
    """--temperature / --top-p (`add_sampling_args`) set the measured requests' sampling and the result's label;
    a script without them stays greedy."""
    from _inprocess import add_common_args, add_sampling_args, sampling_label, sampling_params

    p = argparse.ArgumentParser()
    add_common_args(p, dtype="float32", dataset="humaneval", num_prompts=2, max_tokens=5)
    add_sampling_args(p)
    args = p.parse_args(["--temperature", "0.7", "--top-p", "0.9"])
    events: list = []
    timed_generate(_Recorder(events), args, 2, lambda: None)
    assert [e[2:] for e in events if e != "start"] == [(5, 0.7), (5, 0.7)]
    assert sampling_label(args) == "temperature 0.7, top-p 0.9"
    assert abs(sampling_params(args).top_p - 0.9) < 1e-6
    assert sampling_label(p.parse_args([])) == "greedy"
    plain = argparse.ArgumentParser()
    add_common_args(plain, dtype="float32", dataset="humaneval", num_prompts=2, max_tokens=5)
    greedy = plain.parse_args([])
    events.clear()
    timed_generate(_Recorder(events), greedy, 2, lambda: None)
    assert all(e[3] == 0.0 for e in events if e != "start") and sampling_label(greedy) == "greedy"


def test_ab_sizing_runs_both_bars_on_the_engine():
    """The script's patches reach the engine: both arms are credited decoding steps, and the table says so."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    argv = ["--concurrency", "4", "--num-prompts", "4", "--max-tokens", "24", "--dtype", "float32", "--scale", "0.5"]
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ab_sizing.py"), *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = re.findall(r"^\| ([\d.]+)x \((fit|scaled)\) \| (\d+) \|", run.stdout, re.M)
    assert [(r[0], r[1]) for r in rows] == [("1", "fit"), ("0.5", "scaled")]
    assert all(int(r[2]) > 0 for r in rows)
    assert re.search(r"0\.5x the price over the fit's price, tokens/s of their steps: \d", run.stdout)
