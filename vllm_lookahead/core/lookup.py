"""Prompt lookup over the sequence so far: continuations of earlier occurrences of its last few tokens.

A second source of verification candidates next to the n-gram pool. Lookahead's step is a token tree, so such
candidates hang in the same tree at no extra pass (and merge with the pool's where they share a prefix). Unlike
the pool's fixed N-1 tokens they can be long, which is what repetitive text (code, quotes) rewards.

Each candidate carries what says how far to trust it, as the suffix library's candidates do: how many tokens of
context its occurrence matches (the index keys on the last 1-3 tokens, but an occurrence may match many more), and,
per token, the share of the key's occurrences that agree with it there. Both separate good guesses from bad ones (a
calibration run on 60 prompts of each set, plain decoding's greedy float32 outputs): first tokens were right
0.22-0.24 of the time after a 1-token match, 0.53-0.54 after 2, 0.68-0.71 after 3, 0.79 after 4-7, 0.86-0.89 after
8-15 and 0.96-0.97 after 16 or more (HumanEval, ShareGPT), and 0.72-0.77 where every occurrence agreed against
0.20-0.33 where they did not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from vllm_lookahead.core.tree import Source

# Positions kept per key: the most recent occurrences are the useful ones.
_MAX_POSITIONS = 4
# Context tokens an occurrence is compared over: enough to rank occurrences and to tell long matches.
MATCH_CAP = 16
# Matches of at most SHORT_MATCH tokens are Source.LOOKUP_SHORT, of at least LONG_MATCH Source.LOOKUP_LONG, the rest
# Source.LOOKUP: each learns its own acceptance per depth.
SHORT_MATCH = 2
LONG_MATCH = 8
LOOKUP_SOURCES = (Source.LOOKUP_SHORT, Source.LOOKUP, Source.LOOKUP_LONG)


class LookupMatch(NamedTuple):
    tokens: list[int]  # the continuation
    matched: int  # context tokens its occurrence matches (at most MATCH_CAP)
    estimates: list[float]  # per token: the share of the key's occurrences that agree with it up to there

    @property
    def source(self) -> Source:
        if self.matched <= SHORT_MATCH:
            return Source.LOOKUP_SHORT
        return Source.LOOKUP_LONG if self.matched >= LONG_MATCH else Source.LOOKUP


class LookupIndex:
    """Index of every m-gram (m = 1..max_match) of a growing token sequence -> its latest end positions."""

    __slots__ = ("max_match", "tokens", "_index")

    def __init__(self, tokens: Sequence[int], max_match: int = 3) -> None:
        if max_match < 1:
            raise ValueError(f"lookahead: lookup max_match must be >= 1 (got {max_match})")
        self.max_match = max_match
        self.tokens: list[int] = [int(t) for t in tokens]
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._index_all()

    def _index_all(self) -> None:
        """Index the whole sequence at once (a prompt, when a request's state is built): each key length in one pass
        over zipped slices, about twice as fast as `extend` token by token, to the same positions."""
        toks, index = self.tokens, self._index
        for m in range(1, self.max_match + 1):
            for end, key in enumerate(zip(*(toks[j:] for j in range(m)), strict=False), m - 1):
                pos = index.get(key)
                if pos is None:
                    index[key] = [end]
                else:
                    pos.append(end)
        for pos in index.values():
            if len(pos) > _MAX_POSITIONS:
                del pos[:-_MAX_POSITIONS]

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

    def candidates(self, num: int, length: int) -> list[LookupMatch]:
        """Up to `num` distinct continuations (each <= `length` tokens) of the sequence's end: those of the longest
        key that occurred first, the occurrence matching the most context first (then the most recent)."""
        toks = self.tokens
        end = len(toks) - 1
        if num <= 0 or length <= 0 or end < 1:
            return []
        out: list[LookupMatch] = []
        seen: set[tuple[int, ...]] = set()
        for m in range(min(self.max_match, end), 0, -1):
            ends = [p for p in self._index.get(tuple(toks[end - m + 1 :]), ()) if p < end]
            if not ends:
                continue
            conts = [toks[p + 1 : p + 1 + length] for p in ends]
            matched = [self._matched(p, m) for p in ends]
            for i in sorted(range(len(ends)), key=lambda i: (-matched[i], -ends[i])):
                cont = conts[i]
                key = tuple(cont)
                if key in seen:
                    continue
                seen.add(key)
                out.append(LookupMatch(cont, matched[i], _agreement(cont, conts)))
                if len(out) == num:
                    return out
        return out

    def _matched(self, p: int, m: int) -> int:
        """Context tokens the occurrence ending at p matches (it matches the key's m), up to MATCH_CAP."""
        toks = self.tokens
        end = len(toks) - 1
        k = m
        while k < MATCH_CAP and p - k >= 0 and toks[p - k] == toks[end - k]:
            k += 1
        return k


def _agreement(cont: list[int], conts: list[list[int]]) -> list[float]:
    """Per token of cont: of the continuations that agree with it before that token (and reach it), the share that
    also agree there (cont is one of them, so never 0)."""
    out = []
    alive = conts
    for d, tok in enumerate(cont):
        alive = [c for c in alive if len(c) > d]
        agree = [c for c in alive if c[d] == tok]
        out.append(len(agree) / len(alive))
        alive = agree
    return out
