"""Per-sequence n-gram pool: key token -> up to G recent continuations of N-1 tokens (LRU on both levels)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class NGramPool:
    """Maps a key token to at most `guess_set_size` distinct continuations, each `ngram_size - 1` tokens.

    Values of one key are kept in recency order (re-adding moves to most recent, overflow drops the least
    recent). Keys are capped at `max_keys`, dropping the key least recently added to, so memory per sequence
    is bounded by max_keys * G * (N-1) tokens whatever the generation length. Each value remembers whether the
    Jacobi window found it before the text itself showed it (so the window can be credited when it is accepted).
    """

    __slots__ = ("ngram_size", "guess_set_size", "max_keys", "_table")

    def __init__(self, ngram_size: int, guess_set_size: int, max_keys: int = 4096) -> None:
        if ngram_size < 2:
            raise ValueError(f"lookahead: ngram_size must be >= 2 (got {ngram_size})")
        if guess_set_size < 0:
            raise ValueError(f"lookahead: guess_set_size must be >= 0 (got {guess_set_size})")
        if max_keys < 1:
            raise ValueError(f"lookahead: max_pool_keys must be >= 1 (got {max_keys})")
        self.ngram_size = ngram_size
        self.guess_set_size = guess_set_size
        self.max_keys = max_keys
        # OrderedDict gives O(1) move_to_end/popitem(last=False) for the key LRU. The per-key value sets are
        # tiny (<= G) plain dicts, oldest first, most recent last: value -> found by the window.
        self._table: OrderedDict[int, dict[tuple[int, ...], bool]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def keys(self) -> list[int]:
        """Keys, least recently updated first."""
        return list(self._table)

    def add(self, key: int, value: tuple[int, ...], by_window: bool = False) -> None:
        """Record that `value` followed `key`; it becomes the most recent continuation of `key`. `by_window`: the
        Jacobi window found it (kept only if the pool did not already hold it)."""
        if self.guess_set_size == 0:
            return
        if len(value) != self.ngram_size - 1:
            raise ValueError(f"lookahead: pool value must have {self.ngram_size - 1} tokens (got {len(value)})")
        table = self._table
        values = table.get(key)
        if values is None:
            if len(table) >= self.max_keys:
                table.popitem(last=False)
            values = table[key] = {}
        else:
            table.move_to_end(key)
            # pop + re-insert moves an existing value to the most-recent end of the ordered dict.
            by_window = values.pop(value, by_window)
        values[value] = by_window
        if len(values) > self.guess_set_size:
            del values[next(iter(values))]

    def add_many(self, ngrams: Iterable[tuple[int, tuple[int, ...]]], by_window: bool = False) -> None:
        for key, value in ngrams:
            self.add(key, value, by_window)

    def seed_from_tokens(self, tokens: Sequence[int]) -> None:
        """Add every n-gram of `tokens` in order, so later occurrences end up most recent."""
        if self.guess_set_size == 0:
            return
        n = self.ngram_size
        toks = list(tokens)
        for i in range(len(toks) - n + 1):
            self.add(toks[i], tuple(toks[i + 1 : i + n]))

    def get(self, key: int) -> list[tuple[int, ...]]:
        """Continuations of `key`, most recent first (at most G). Lookups do not refresh recency."""
        values = self._table.get(key)
        if not values:
            return []
        return list(reversed(values))

    def get_with_origin(self, key: int) -> list[tuple[tuple[int, ...], bool]]:
        """(continuation, found by the window) pairs of `key`, most recent first."""
        values = self._table.get(key)
        if not values:
            return []
        return list(reversed(values.items()))
