"""Shared by the benchmark scripts: append a run's rows to a JSONL file with its settings and a timestamp."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def append_jsonl(path: str | Path, settings: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Rows as JSON lines; the user's home directory in any path written as `~` (results get committed)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    home = str(Path.home()).rstrip("/") + "/"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for row in rows:
            line = json.dumps({"time": stamp, "settings": settings, **row})
            f.write((line if home == "/" else line.replace(home, "~/")) + "\n")
    print(f"raw results appended to: {path}")
