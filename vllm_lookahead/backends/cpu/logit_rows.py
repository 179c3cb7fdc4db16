"""Logits rows' argmax and top tokens on a CPU from the compiled library (`csrc/row_select.cpp`): one pass per row in
its own dtype, the rows asked for read in place (torch's topk sorts index-value pairs, and its argmax over bfloat16
rows goes through a float32 copy); a row's argmax is the first of its top k (the library's order ties to the lower
index, NaN first, as vLLM's argmax), so `pick` reads each row once. Matrices the library does not read take torch's
path (`backends.logit_rows`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_lookahead.backends.cpu.library import CompiledLibrary, load, takes_rows
from vllm_lookahead.backends.logit_rows import LogitRows, Picks


class CompiledRows(LogitRows):
    def __init__(self, library: CompiledLibrary) -> None:
        self.library = library

    def _reads(self, matrix: torch.Tensor, k: int) -> bool:
        return takes_rows(matrix) and 1 <= k <= min(self.library.max_k, matrix.shape[1])

    def pick(self, logits: torch.Tensor, rows: Sequence[int] | None = None, k: int = 0) -> Picks:
        if k > 0 and self._reads(logits, k):
            top = self.library.top_k(logits, k, rows)
            return Picks(top[:, 0].tolist(), top.tolist())
        return super().pick(logits, rows, k)

    def argmax(self, logits: torch.Tensor, rows: Sequence[int] | None = None) -> list[int]:
        if self._reads(logits, 1):
            return self.library.top_k(logits, 1, rows)[:, 0].tolist()
        return super().argmax(logits, rows)

    def topk(self, logits: torch.Tensor, k: int, rows: Sequence[int] | None = None) -> list[list[int]]:
        if self._reads(logits, k):
            return self.library.top_k(logits, k, rows).tolist()
        return super().topk(logits, k, rows)


def cpu_rows(compiled: bool = True) -> LogitRows:
    """A CPU engine's row selection: the compiled library's where it loads (and `compiled`), else torch's."""
    lib = load() if compiled else None
    return LogitRows() if lib is None else CompiledRows(lib)
