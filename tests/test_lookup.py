"""Prompt lookup index: continuations of earlier occurrences of the sequence's last tokens."""

from __future__ import annotations

import pytest

from vllm_lookahead.core.lookup import MATCH_CAP, LookupIndex, LookupMatch
from vllm_lookahead.core.tree import Source


def matched(tokens, p, m):
    """Context tokens the occurrence ending at p matches, by brute force."""
    end = len(tokens) - 1
    k = m
    while k < MATCH_CAP and p - k >= 0 and tokens[p - k] == tokens[end - k]:
        k += 1
    return k


def brute(tokens, num, length, max_match):
    end = len(tokens) - 1
    out = []
    for m in range(min(max_match, end), 0, -1):
        suffix = tokens[end - m + 1 :]
        # the index keeps a key's 4 latest ends, the sequence's own end among them
        ends = [p for p in range(m - 1, end + 1) if tokens[p - m + 1 : p + 1] == suffix][-4:][:-1]
        conts = [tokens[p + 1 : p + 1 + length] for p in ends]
        for p in sorted(ends, key=lambda p: (-matched(tokens, p, m), -p)):
            cont = tokens[p + 1 : p + 1 + length]
            if all(cont != c.tokens for c in out):
                shares = []
                for d in range(len(cont)):
                    alive = [c for c in conts if len(c) > d and c[:d] == cont[:d]]
                    shares.append(sum(c[d] == cont[d] for c in alive) / len(alive))
                out.append(LookupMatch(cont, matched(tokens, p, m), shares))
    return out[:num]


def test_longest_match_first():
    idx = LookupIndex([1, 2, 3, 4, 9, 3, 5, 6, 2, 3], max_match=2)
    # suffix (2, 3) occurred at positions 1..2 -> continuation 4 9 3; then suffix (3,) at 5 -> 5 6 2
    assert idx.candidates(2, 3) == [([4, 9, 3], 2, [1.0, 1.0, 1.0]), ([5, 6, 2], 1, [0.5, 1.0, 1.0])]
    assert idx.candidates(1, 2) == [([4, 9], 2, [1.0, 1.0])]


def test_the_occurrence_matching_more_context_comes_first():
    """Of two occurrences of the key, the one whose earlier tokens match the sequence's too wins over the more
    recent one, and the share of occurrences agreeing on each token is its estimate."""
    seq = [7, 8, 1, 2, 3, 4, 5, 0, 1, 2, 3, 6, 9, 7, 8, 1, 2, 3]
    (best, other) = LookupIndex(seq).candidates(2, 2)
    assert best == ([4, 5], 5, [0.5, 1.0]) and best.source == Source.LOOKUP  # 7 8 1 2 3 matched
    assert other == ([6, 9], 3, [0.5, 1.0])
    long = LookupIndex([*range(10, 20), 5, *range(10, 20)]).candidates(1, 3)[0]
    assert long.tokens == [5, 10, 11] and long.matched == 10 and long.source == Source.LOOKUP_LONG
    short = LookupIndex([1, 2, 3, 9, 2]).candidates(1, 2)[0]
    assert short.tokens == [3, 9] and short.matched == 1 and short.source == Source.LOOKUP_SHORT


def test_incremental_equals_bulk_and_brute_force():
    import random

    rng = random.Random(0)
    for _ in range(300):
        toks = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
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
