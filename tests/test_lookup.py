"""Prompt lookup index: continuations of earlier occurrences of the sequence's last tokens."""

from __future__ import annotations

import pytest

from vllm_lookahead.lookup import LookupIndex


def brute(tokens, num, length, max_match):
    end = len(tokens) - 1
    out = []
    for m in range(min(max_match, end), 0, -1):
        suffix = tokens[end - m + 1 :]
        ends = [p for p in range(m - 1, end) if tokens[p - m + 1 : p + 1] == suffix]
        for p in reversed(ends[-4:]):
            cont = tokens[p + 1 : p + 1 + length]
            if cont and all(cont != c for c, _ in out):
                out.append((cont, m))
    return out[:num]


def test_longest_match_first():
    idx = LookupIndex([1, 2, 3, 4, 9, 3, 5, 6, 2, 3], max_match=2)
    # suffix (2, 3) occurred at positions 1..2 -> continuation 4 9 3; then suffix (3,) at 5 -> 5 6 2
    assert idx.candidates(2, 3) == [([4, 9, 3], 2), ([5, 6, 2], 1)]
    assert idx.candidates(1, 2) == [([4, 9], 2)]


def test_incremental_equals_bulk_and_brute_force():
    import random

    rng = random.Random(0)
    for _ in range(200):
        toks = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        a = LookupIndex(toks, max_match=3)
        b = LookupIndex(toks[:3], max_match=3)
        b.extend(toks[3:])
        assert a.candidates(3, 4) == b.candidates(3, 4) == brute(toks, 3, 4, 3)


def test_no_candidates_without_history():
    assert LookupIndex([5]).candidates(2, 4) == []
    assert LookupIndex([5, 6]).candidates(0, 4) == []


def test_bad_max_match():
    with pytest.raises(ValueError, match="max_match"):
        LookupIndex([], max_match=0)
