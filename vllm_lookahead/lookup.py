"""Prompt lookup over the sequence so far: continuations of earlier occurrences of its last few tokens.

A second source of verification candidates next to the n-gram pool. Lookahead's step is a token tree, so such
candidates hang in the same tree at no extra pass (and merge with the pool's where they share a prefix). Unlike
the pool's fixed N-1 tokens they can be long, which is what repetitive text (code, quotes) rewards.
"""

from __future__ import annotations

from collections.abc import Sequence

# Positions kept per key: the most recent occurrences are the useful ones.
_MAX_POSITIONS = 4


class LookupIndex:
    """Index of every m-gram (m = 1..max_match) of a growing token sequence -> its latest end positions."""

    __slots__ = ("max_match", "tokens", "_index")

    def __init__(self, tokens: Sequence[int], max_match: int = 3) -> None:
        if max_match < 1:
            raise ValueError(f"lookahead: lookup max_match must be >= 1 (got {max_match})")
        self.max_match = max_match
        self.tokens: list[int] = []
        self._index: dict[tuple[int, ...], list[int]] = {}
        self.extend(tokens)

    def extend(self, new_tokens: Sequence[int]) -> None:
        toks = self.tokens
        index = self._index
        for t in new_tokens:
            toks.append(int(t))
            end = len(toks) - 1
            for m in range(1, min(self.max_match, end + 1) + 1):
                key = tuple(toks[end - m + 1 : end + 1])
                pos = index.get(key)
                if pos is None:
                    index[key] = [end]
                else:
                    pos.append(end)
                    if len(pos) > _MAX_POSITIONS:
                        del pos[0]

    def candidates(self, num: int, length: int) -> list[tuple[list[int], int]]:
        """Up to `num` distinct continuations (each <= `length` tokens) of the sequence's end, each with the length
        of the match it continues; longest match first, most recent occurrence first."""
        toks = self.tokens
        end = len(toks) - 1
        if num <= 0 or length <= 0 or end < 1:
            return []
        out: list[tuple[list[int], int]] = []
        seen: set[tuple[int, ...]] = set()
        for m in range(min(self.max_match, end), 0, -1):
            for p in reversed(self._index.get(tuple(toks[end - m + 1 :]), ())):
                if p >= end:
                    continue
                cont = toks[p + 1 : p + 1 + length]
                key = tuple(cont)
                if cont and key not in seen:
                    seen.add(key)
                    out.append((cont, m))
                    if len(out) == num:
                        return out
        return out
