"""The suffix corpus (`suffix_corpus`): texts the global suffix tree holds from start-up, read from a JSON Lines file.

Like REST's datastore (He et al., NAACL 2024), without a separate index: texts of the kind the server will write
(past answers, documentation, code of the project) become finished outputs in the suffix tree that suffix decoding
already keeps over earlier requests, so the first requests draft from them too. No vLLM imports.
"""

from __future__ import annotations

import json
from pathlib import Path


def read_corpus(path: str | Path) -> list[str]:
    """The texts of a JSON Lines file: each non-blank line a JSON string or an object with a string "text"; empty
    texts skipped. Raises ValueError naming the key, the file and the line of the first bad line."""
    try:
        with open(path, encoding="utf-8-sig") as f:  # a byte-order mark is not part of the first line
            lines = f.read().split("\n")  # not splitlines: JSON strings may hold U+2028 and the like raw
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"lookahead: suffix_corpus {path}: cannot be read as UTF-8 text ({e})") from None
    texts: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"lookahead: suffix_corpus {path}, line {number}: not JSON ({e.msg})") from None
        text = item.get("text") if isinstance(item, dict) else item
        if not isinstance(text, str):
            raise ValueError(
                f"lookahead: suffix_corpus {path}, line {number}: expected a string or an object with a "
                f'"text" string, got {line.strip()[:80]!r}'
            )
        if text.strip():
            texts.append(text)
    return texts
