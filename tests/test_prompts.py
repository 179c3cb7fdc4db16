"""Prompt loaders: real HumanEval and ShareGPT prompts from their wheels, and the truncated-JSON reader."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from vllm_lookahead.devtools import prompts


def test_humaneval_first_prompts():
    got = prompts.humaneval_prompts(5)
    assert len(got) == 5
    assert all(isinstance(p, str) and "def " in p and '"""' in p for p in got)
    # File order: HumanEval/0 is has_close_elements.
    assert "def has_close_elements(" in got[0]
    assert got == prompts.humaneval_prompts(5)
    assert prompts.humaneval_prompts(2) == got[:2]


def test_humaneval_all():
    assert len(prompts.humaneval_prompts()) == 164


def test_sharegpt_first_prompts():
    got = prompts.sharegpt_prompts(5)
    assert len(got) == 5
    assert all(isinstance(p, str) and 32 <= len(p) <= 2000 and p == p.strip() for p in got)
    assert got[0].startswith("Summarize the main ideas of Jeff Walker's Product Launch Formula")
    assert got == prompts.sharegpt_prompts(5)
    assert prompts.sharegpt_prompts(3) == got[:3]
    assert prompts.sharegpt_prompts(0) == []


def test_sharegpt_length_filter():
    long = prompts.sharegpt_prompts(5, min_chars=500, max_chars=1000)
    assert len(long) == 5 and all(500 <= len(p) <= 1000 for p in long)
    short = prompts.sharegpt_prompts(5, min_chars=1, max_chars=40)
    assert len(short) == 5 and all(len(p) <= 40 for p in short)
    assert not set(long) & set(short)


def _write_truncated(path: Path, items: list[dict], tail: str) -> None:
    text = "[\n" + ",\n".join("  " + json.dumps(item, indent=2) for item in items) + ",\n" + tail
    path.write_text(text, encoding="utf-8")


def _conv(i: int, first: str = "human") -> dict:
    return {
        "id": f"c{i}",
        "conversations": [
            {"from": first, "value": f"  question number {i} with enough text to pass the filter  "},
            {"from": "gpt", "value": "an answer with a brace } and a bracket ] inside " * 3},
            {"from": "human", "value": f"follow-up {i}"},
        ],
    }


@pytest.mark.parametrize("chunk_chars", [7, 64, 1 << 20])
def test_truncated_array_stops_at_incomplete_item(tmp_path, chunk_chars):
    items = [_conv(i) for i in range(6)]
    path = tmp_path / "cut.json"
    _write_truncated(path, items, '  {"id": "c6", "conversations": [{"from": "human", "value": "cut he')
    assert list(prompts.iter_json_array(path, chunk_chars=chunk_chars)) == items


@pytest.mark.parametrize("chunk_chars", [3, 1 << 20])
def test_complete_and_odd_arrays(tmp_path, chunk_chars):
    path = tmp_path / "a.json"
    path.write_text(' [1, 22, {"a": [1, 2]}, "x" , 12345 ] ', encoding="utf-8")
    assert list(prompts.iter_json_array(path, chunk_chars)) == [1, 22, {"a": [1, 2]}, "x", 12345]
    path.write_text("[1, 2, 345", encoding="utf-8")  # a bare number at the very end counts as complete
    assert list(prompts.iter_json_array(path, chunk_chars)) == [1, 2, 345]
    path.write_text("[]", encoding="utf-8")
    assert list(prompts.iter_json_array(path, chunk_chars)) == []
    path.write_text("", encoding="utf-8")
    assert list(prompts.iter_json_array(path, chunk_chars)) == []
    path.write_text('{"a": 1}', encoding="utf-8")
    with pytest.raises(ValueError, match="JSON array"):
        list(prompts.iter_json_array(path, chunk_chars))


def test_sharegpt_from_truncated_file(tmp_path):
    items = [_conv(0), _conv(1, first="gpt"), {"id": "empty", "conversations": []}, _conv(3), _conv(4)]
    path = tmp_path / "cut.json"
    _write_truncated(path, items, '  {"id": "c5", "conv')
    got = prompts.sharegpt_prompts(path=path)
    # The gpt-first conversation contributes its first human turn (too short here), the empty one nothing.
    assert got == [f"question number {i} with enough text to pass the filter" for i in (0, 3, 4)]
    assert prompts.sharegpt_prompts(2, path=path) == got[:2]
    assert prompts.sharegpt_prompts(min_chars=1, path=path)[1] == "follow-up 1"


def test_sharegpt_answers_start_where_asked_and_skip_conversations_without_one(tmp_path):
    items = [_conv(0), _conv(1, first="gpt"), {"id": "empty", "conversations": []}, _conv(3), _conv(4)]
    path = tmp_path / "cut.json"
    _write_truncated(path, items, '  {"id": "c5", "conv')
    answer = "an answer with a brace } and a bracket ] inside " * 3
    # conversation 1 opens with a gpt turn: that is its first answer; the empty one has none
    assert prompts.sharegpt_answers(9, start=1, path=path) == [items[1]["conversations"][0]["value"], answer, answer]
    assert prompts.sharegpt_answers(1, start=3, path=path) == [answer]
    assert prompts.sharegpt_answers(0, start=0, path=path) == []


def test_sharegpt_answers_come_after_every_prompt_the_benchmarks_take(tmp_path):
    first = prompts.sharegpt_answers(2)
    assert len(first) == 2 and all(a.strip() for a in first)
    assert first == prompts.sharegpt_answers(2, start=prompts.SHAREGPT_ANSWERS_FROM)
    # the benchmarks take at most 2000 prompts (bench_long.py): the conversations before the answers' start hold them
    whole = prompts.data_file(prompts.SHAREGPT_MODULE, prompts.SHAREGPT_FILE)
    before = list(itertools.islice(prompts.iter_json_array(whole), prompts.SHAREGPT_ANSWERS_FROM))
    (tmp_path / "before.json").write_text(json.dumps(before), encoding="utf-8")
    assert prompts.sharegpt_prompts(2000, path=tmp_path / "before.json") == prompts.sharegpt_prompts(2000)


def test_missing_package_is_explained():
    with pytest.raises(FileNotFoundError, match="not installed"):
        prompts.data_file("no_such_package_for_prompts", "x.json")


class _TemplateTokenizer:
    """Records how the chat template is applied (the real template is covered by test_models)."""

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        assert add_generation_prompt and not tokenize
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return body + "<|im_start|>assistant\n"


def test_as_chat_wraps_one_user_turn():
    text = prompts.as_chat(_TemplateTokenizer(), "Hello there")
    assert text == "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
