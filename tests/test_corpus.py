"""The suffix corpus (`suffix_corpus`): its file read into texts, its key checked at start-up, its texts drafted."""

from __future__ import annotations

import json

import pytest

from vllm_lookahead.core.corpus import read_corpus
from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.core.suffix import SuffixCandidates


def test_a_line_is_a_string_or_an_object_with_a_text(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [json.dumps("first text"), "", json.dumps({"text": "second", "source": "x"}), json.dumps("  "), "  "]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert read_corpus(path) == ["first text", "second"]  # blank lines and empty texts skipped


@pytest.mark.parametrize(
    ("line", "message"),
    [("{not json", "line 2: not JSON"), ('{"body": "x"}', 'line 2: expected a string or an object with a "text"'),
     ("3", "line 2: expected a string")],
)  # fmt: skip
def test_a_bad_line_is_refused_naming_the_key_and_the_line(tmp_path, line, message):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps("fine") + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"suffix_corpus .*{message}"):
        read_corpus(path)


def test_a_byte_order_mark_is_read_past_and_an_unreadable_file_named(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps("after a mark\u2028and a line separator").encode() + b"\n")
    assert read_corpus(path) == ["after a mark\u2028and a line separator"]
    path.write_bytes(b'"\xff\xfe"\n')
    with pytest.raises(ValueError, match="suffix_corpus .* cannot be read as UTF-8"):
        read_corpus(path)


def test_a_relative_or_home_path_is_kept_absolute(tmp_path, monkeypatch):
    (tmp_path / "c.jsonl").write_text('"x"\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert LookaheadParams(suffix_corpus="c.jsonl").suffix_corpus == str(tmp_path / "c.jsonl")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert LookaheadParams(suffix_corpus="~/c.jsonl").suffix_corpus == str(tmp_path / "c.jsonl")


def test_the_key_is_null_or_an_existing_file(tmp_path):
    assert LookaheadParams().suffix_corpus is None
    path = tmp_path / "c.jsonl"
    path.write_text('"x"\n', encoding="utf-8")
    assert LookaheadParams(suffix_corpus=str(path)).suffix_corpus == str(path)
    with pytest.raises(ValueError, match="suffix_corpus needs suffix_cache_requests > 0"):
        LookaheadParams(suffix_corpus=str(path), suffix_cache_requests=0)
    with pytest.raises(ValueError, match="suffix_corpus needs suffix_candidates > 0"):
        LookaheadParams.from_mapping({"suffix_corpus": str(path), "suffix_candidates": 0})
    for bad in (str(tmp_path / "missing.jsonl"), str(tmp_path), 3, ""):
        with pytest.raises(ValueError, match="suffix_corpus must be null or the path of an existing file"):
            LookaheadParams(suffix_corpus=bad)


def test_a_request_may_turn_the_suffix_trees_off_on_a_server_with_a_corpus(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('"x"\n', encoding="utf-8")
    server = LookaheadParams.from_mapping({"suffix_corpus": str(path)})
    own = server.for_request({"suffix_candidates": 0})
    assert own.suffix_candidates == 0 and own.suffix_corpus == server.suffix_corpus


def test_seeded_outputs_are_drafted_before_any_request_and_evicted_first():
    pytest.importorskip("arctic_inference")
    sc = SuffixCandidates(max_depth=16, max_cached_requests=3)
    text = [(i * 7919) % 1000 + 10 for i in range(40)]
    sc.seed([text, [5, 6, 7]])
    assert sc.cached_requests() == 2 and sc.cached_tokens() == 43
    sc.start("r", [1, 2, *text[:8]])
    (best, *_) = sc.candidates("r", [1, 2, *text[:8]], 8)  # 8 tokens matched: up to 8 speculated (SPEC_FACTOR 1)
    assert list(best.tokens) == text[8:16]
    sc.stop("r")
    assert sc.cached_requests() == 3  # the two texts and r's (empty) output
    sc.start("s", [9])  # a fourth: the corpus's oldest text goes first
    assert sc.cached_requests() == 3 and sc.cached_tokens() == 3
