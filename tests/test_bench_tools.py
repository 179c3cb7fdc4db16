"""`vllm_lookahead.devtools.bench`, the benchmarks' shared helpers: result files, the methods compared, the timed
generation of an in-process engine and the clock over its steps (against stand-ins for vLLM's engine)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_lookahead.devtools import bench
from vllm_lookahead.devtools.prompts import humaneval_prompts


def test_the_home_directory_is_written_as_a_tilde(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.Path, "home", lambda: Path("/home/someone"))
    out = tmp_path / "r.jsonl"
    bench.append_jsonl(out, {"model": "/home/someone/.cache/m", "other": "/home/someone-else/m"}, [{"a": 1}])
    row = json.loads(out.read_text())
    assert row["settings"] == {"model": "~/.cache/m", "other": "/home/someone-else/m"} and row["a"] == 1


def test_a_missing_results_folder_is_created(tmp_path):
    out = tmp_path / "new" / "deeper" / "r.jsonl"
    bench.append_jsonl(out, {}, [{"a": 1}, {"a": 2}])
    assert [json.loads(line)["a"] for line in out.read_text().splitlines()] == [1, 2]


def test_none_sync_is_plain_decoding_without_async_scheduling():
    """vLLM turns async scheduling on for plain decoding only; none-sync turns it off, an argument vLLM must know."""
    from vllm.engine.arg_utils import EngineArgs

    assert bench.METHODS["none-sync"] is None  # no speculative_config: plain decoding
    assert bench.engine_options("none-sync") == {"async_scheduling": False}
    assert bench.engine_options("none") == {} and bench.engine_options("lookahead") == {}
    assert "async_scheduling" in {f.name for f in dataclasses.fields(EngineArgs)}


def test_lookahead_settings_reach_every_lookahead_method_only():
    extra = '{"window_size": 6}'
    assert bench.speculative_config("lookahead-nolookup", extra) == {
        "method": "lookahead", "lookup_candidates": 0, "window_size": 6,
    }  # fmt: skip
    assert bench.speculative_config("suffix", extra) == {"method": "suffix", "num_speculative_tokens": 8}
    assert bench.speculative_config("none", extra) is None
    assert bench.method_environment("lookahead-reference", sampled=False) == {"VLLM_LOOKAHEAD_TREE_KERNEL": "0"}
    assert bench.method_environment("lookahead-chain", sampled=False) == {"VLLM_LOOKAHEAD_BACKEND": "chain"}
    assert bench.method_environment("none", sampled=True) == {"VLLM_LOOKAHEAD_FIX_CPU_SAMPLING": "1"}


def test_lookahead_corpus_loads_sharegpt_answers_apart_from_the_prompts(tmp_path, monkeypatch):
    from vllm_lookahead.core.corpus import read_corpus
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.devtools.prompts import sharegpt_answers

    monkeypatch.setattr(bench.Path, "home", lambda: tmp_path)
    monkeypatch.setattr(bench, "CORPUS_ANSWERS", 3)
    spec = bench.speculative_config("lookahead-corpus")
    assert spec["method"] == "lookahead" and spec["suffix_corpus"].startswith(str(tmp_path))
    assert read_corpus(spec["suffix_corpus"]) == sharegpt_answers(3)
    assert LookaheadParams.from_mapping({k: v for k, v in spec.items() if k != "method"}).suffix_corpus


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
    outs, seconds, tokens = bench.timed_generate(_Recorder(events), args, concurrency, lambda: events.append("start"))
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
    p = argparse.ArgumentParser()
    bench.add_common_args(p, dtype="float32", dataset="humaneval", num_prompts=2, max_tokens=5)
    bench.add_sampling_args(p)
    args = p.parse_args(["--temperature", "0.7", "--top-p", "0.9"])
    events: list = []
    bench.timed_generate(_Recorder(events), args, 2, lambda: None)
    assert [e[2:] for e in events if e != "start"] == [(5, 0.7), (5, 0.7)]
    assert bench.sampling_label(args) == "temperature 0.7, top-p 0.9"
    assert abs(bench.sampling_params(args).top_p - 0.9) < 1e-6
    assert bench.sampling_label(p.parse_args([])) == "greedy"
    plain = argparse.ArgumentParser()
    bench.add_common_args(plain, dtype="float32", dataset="humaneval", num_prompts=2, max_tokens=5)
    greedy = plain.parse_args([])
    events.clear()
    bench.timed_generate(_Recorder(events), greedy, 2, lambda: None)
    assert all(e[3] == 0.0 for e in events if e != "start") and bench.sampling_label(greedy) == "greedy"


class _Engine:
    """Stands in for vLLM's LLMEngine: each step gives the request the next batch of tokens (cumulative outputs, as
    vLLM's default output kind), after a step that returns nothing of it (a partial prefill)."""

    def __init__(self, gains: list[int]) -> None:
        self.gains, self.added, self.tokens = list(gains), [], []

    def has_unfinished_requests(self) -> bool:
        return bool(self.added) and bool(self.gains)

    def add_request(self, request_id: str, prompt, params) -> None:  # noqa: ANN001
        self.added.append(request_id)

    def step(self) -> list:
        gain = self.gains.pop(0)
        self.tokens += list(range(len(self.tokens), len(self.tokens) + gain))
        out = SimpleNamespace(request_id=self.added[-1], outputs=[SimpleNamespace(token_ids=list(self.tokens))])
        other = SimpleNamespace(request_id="someone-else", outputs=[SimpleNamespace(token_ids=[9] * 50)])
        return [other, out] if gain else [other]


def test_the_step_clock_times_every_step_and_counts_the_tokens_it_made():
    engine = _Engine([0, 1, 3, 1])
    seen: list[int] = []
    final, steps = bench.step_clock(SimpleNamespace(llm_engine=engine), {"prompt_token_ids": [1]}, None, seen.append)
    assert final.outputs[0].token_ids == [0, 1, 2, 3, 4]
    assert [n for _, n in steps] == [0, 1, 3, 1] and all(s >= 0 for s, _ in steps)
    assert seen == [0, 1, 4, 5]  # after every step, the tokens so far


def test_the_step_clock_times_a_request_alone():
    engine = _Engine([1])
    engine.added.append("earlier")
    with pytest.raises(RuntimeError, match="alone"):
        bench.step_clock(SimpleNamespace(llm_engine=engine), {"prompt_token_ids": [1]}, None)


def test_counters_over_a_span_subtract_position_by_position():
    before = {"drafts": 2, "draft_tokens": 10, "accepted_tokens": 4, "accepted_per_pos": [2, 1]}
    after = {"drafts": 5, "draft_tokens": 30, "accepted_tokens": 9, "accepted_per_pos": [4, 2, 1]}
    assert bench.counters_since(before, after) == {
        "drafts": 3, "draft_tokens": 20, "accepted_tokens": 5, "accepted_per_pos": [2, 1, 1],
    }  # fmt: skip


def test_benchmarks_and_tests_put_nothing_on_sys_path():
    """The scripts import their helpers from this module, and tests load scripts by path (`tests/scripts.py`)."""
    import re

    root = Path(__file__).resolve().parents[1]
    for path in [*root.glob("benchmarks/**/*.py"), *root.glob("tests/*.py")]:
        assert not re.search(r"sys\.path\.(insert|append|extend)|sys\.path \+?=", path.read_text()), path
