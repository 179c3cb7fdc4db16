"""The 2D Jacobi window of lookahead decoding (the lookahead branch), kept as plain Python lists.

Conventions (shared with tree.py, state.py and the glue): x0 is the last accepted token, at position p, whose
KV is not yet computed. Slot (r, i) (row r, column i) holds the guess for position p + r + i; row 0 column 0
is x0 itself. Slot (r, i) attends to row 0 columns 0..i and then column i rows 1..r, i.e. its root path is
[row0[0], ..., row0[i], row1[i], ..., row_r[i]] and its depth is r + i.

Rows present: fill + 1 (fill = 0..N-2). During warm-up (fill < N-2) every row has W + (N-2-fill) columns;
in steady state (fill == N-2) every row has W columns. The window is always rectangular.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


class JacobiWindow:
    __slots__ = ("window_size", "ngram_size", "_rows", "_fill")

    def __init__(self, window_size: int, ngram_size: int, guesses: Sequence[int], x0: int = -1) -> None:
        """Start in warm-up with row 0 = [x0] + guesses; needs exactly (W-1) + (N-2) guesses."""
        if window_size < 1 or ngram_size < 2:
            raise ValueError(f"lookahead: bad window shape W={window_size}, N={ngram_size}")
        need = window_size - 1 + ngram_size - 2
        if len(guesses) != need:
            raise ValueError(f"lookahead: initial window needs {need} guesses (got {len(guesses)})")
        self.window_size = window_size
        self.ngram_size = ngram_size
        self._rows: list[list[int]] = [[x0, *guesses]]
        self._fill = 0

    @classmethod
    def from_tokens(
        cls,
        window_size: int,
        ngram_size: int,
        source_tokens: Sequence[int],
        rng: random.Random,
        x0: int = -1,
    ) -> JacobiWindow:
        """Initial guesses drawn uniformly (with replacement) from `source_tokens`, normally the prompt.

        An empty source falls back to guessing x0 (or token 0 when x0 is unknown): any guess is correct
        for exactness, only acceptance suffers.
        """
        need = window_size - 1 + ngram_size - 2
        source = list(source_tokens) or [x0 if x0 >= 0 else 0]
        return cls(window_size, ngram_size, rng.choices(source, k=need), x0)

    @property
    def rows(self) -> list[list[int]]:
        """The live rows (not a copy, do not mutate)."""
        return self._rows

    @property
    def fill(self) -> int:
        """Rows filled beyond row 0; the last row's index."""
        return self._fill

    @property
    def num_cols(self) -> int:
        return len(self._rows[0])

    def set_x0(self, x0: int) -> None:
        """Slot (0, 0) is the tree root; set the real x0 before the step so column 0's n-gram is right."""
        self._rows[0][0] = x0

    def step(self, x0_new: int, last_outputs: Sequence[int | None]) -> list[tuple[int, tuple[int, ...]]]:
        """Advance one position; returns the n-grams (key, value) the pool should learn (none in warm-up).

        `last_outputs[i]` is the target's argmax at slot (fill, i), the prediction for position
        p + fill + i + 1; only the last row's outputs are needed. None marks a slot that was not computed
        (tree truncated): it is replaced by the old guess for the same position, old slot (fill, i+1) (or
        the row's last token for the last column), and its column yields no n-gram.
        """
        rows = self._rows
        k = self._fill
        last = rows[k]
        ncols = len(last)
        if len(last_outputs) != ncols:
            raise ValueError(f"lookahead: expected {ncols} window outputs (got {len(last_outputs)})")
        out = list(last_outputs)
        complete = None not in out
        if not complete:
            for i, o in enumerate(out):
                if o is None:
                    out[i] = last[i + 1] if i + 1 < ncols else last[-1]

        if k < self.ngram_size - 2:
            # Warm-up: every row drops its first column (slot (r, i+1) is at the new (r, i)'s position),
            # row 0 takes x0_new as its column 0, and the outputs (minus the first) become a new last row.
            new_rows = [[x0_new, *rows[0][2:]]]
            new_rows.extend(row[1:] for row in rows[1:])
            new_rows.append(out[1:])  # type: ignore[arg-type]
            self._rows = new_rows
            self._fill = k + 1
            return []

        # Steady state. Column i's n-gram: key row0[i], value = rows 1..N-2 of column i + the new output.
        keys = rows[0]
        columns = zip(*rows[1:], out, strict=True)
        if complete:
            ngrams = list(zip(keys, columns, strict=True))
        else:
            ngrams = [(key, col) for key, col, o in zip(keys, columns, last_outputs, strict=True) if o is not None]
        # Shift up: new (r, i) at p+1+r+i is old (r+1, i); the outputs become the last row; row 0 keeps
        # x0_new at column 0 instead of the old row 1's column 0.
        nxt = rows[1:]
        nxt.append(out)  # type: ignore[arg-type]
        nxt[0] = [x0_new, *nxt[0][1:]]
        self._rows = nxt
        return ngrams  # type: ignore[return-value]
