import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.core.pool import NGramPool


def test_most_recent_first_dedup_and_refresh():
    pool = NGramPool(3, 3)
    pool.add(1, (2, 3))
    pool.add(1, (4, 5))
    pool.add(1, (2, 3))  # re-insert: moves to most recent, no duplicate
    assert pool.get(1) == [(2, 3), (4, 5)]
    pool.add(1, (6, 7))
    pool.add(1, (8, 9))  # 4th distinct value with G=3: evicts the least recent, (4, 5)
    assert pool.get(1) == [(8, 9), (6, 7), (2, 3)]
    assert sum(len(pool.get(k)) for k in pool.keys()) == 3


def test_unknown_key_and_g_zero():
    pool = NGramPool(4, 0)
    pool.add(1, (2, 3, 4))
    pool.seed_from_tokens([1, 2, 3, 4, 5, 6])
    assert pool.get(1) == []
    assert len(pool) == 0
    assert NGramPool(4, 2).get(7) == []


def test_value_length_checked():
    pool = NGramPool(4, 2)
    with pytest.raises(ValueError, match="pool value must have 3 tokens"):
        pool.add(1, (2, 3))


@pytest.mark.parametrize(
    "args, message",
    [((1, 2), "ngram_size must be >= 2"), ((3, -1), "guess_set_size must be >= 0")],
)
def test_constructor_checks(args, message):
    with pytest.raises(ValueError, match=message):
        NGramPool(*args)
    with pytest.raises(ValueError, match="max_pool_keys must be >= 1"):
        NGramPool(3, 2, max_keys=0)


def test_seed_from_tokens_adds_every_ngram_later_ones_most_recent():
    pool = NGramPool(3, 4)
    pool.seed_from_tokens([5, 1, 2, 5, 3, 4, 1, 2])
    assert pool.get(5) == [(3, 4), (1, 2)]
    assert pool.get(1) == [(2, 5)]
    assert pool.get(2) == [(5, 3)]
    assert pool.get(3) == [(4, 1)]
    assert pool.get(4) == [(1, 2)]
    assert sorted(pool.keys()) == [1, 2, 3, 4, 5]
    short = NGramPool(5, 2)
    short.seed_from_tokens([1, 2, 3])  # shorter than one n-gram
    assert len(short) == 0


def test_key_cap_evicts_least_recently_updated_key():
    pool = NGramPool(2, 2, max_keys=2)
    pool.add(1, (10,))
    pool.add(2, (20,))
    pool.add(1, (11,))  # key 1 updated: key 2 is now the least recently updated
    assert pool.get(2) == [(20,)]  # reading does not refresh
    pool.add(3, (30,))
    assert 2 not in pool.keys()
    assert pool.get(1) == [(11,), (10,)]
    assert pool.get(3) == [(30,)]
    assert len(pool) == 2


class _ReferencePool:
    """Naive model of the specified behaviour: lists, linear scans."""

    def __init__(self, g, max_keys):
        self.g, self.max_keys = g, max_keys
        self.values = {}  # key -> list, most recent last
        self.order = []  # keys, least recently updated first

    def add(self, key, value):
        if self.g == 0:
            return
        if key in self.values:
            self.order.remove(key)
        elif len(self.values) >= self.max_keys:
            del self.values[self.order.pop(0)]
        self.order.append(key)
        vals = self.values.setdefault(key, [])
        if value in vals:
            vals.remove(value)
        vals.append(value)
        if len(vals) > self.g:
            vals.pop(0)

    def get(self, key):
        return list(reversed(self.values.get(key, [])))


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(2, 4),
    g=st.integers(0, 4),
    max_keys=st.integers(1, 5),
    ops=st.lists(st.tuples(st.integers(0, 6), st.lists(st.integers(0, 2), min_size=3, max_size=3)), max_size=60),
)
def test_matches_reference_model(n, g, max_keys, ops):
    pool = NGramPool(n, g, max_keys=max_keys)
    ref = _ReferencePool(g, max_keys)
    for key, val in ops:
        value = tuple(val[: n - 1])
        pool.add(key, value)
        ref.add(key, value)
        assert len(pool) <= max_keys
    for key in range(7):
        got = pool.get(key)
        assert got == ref.get(key)
        assert len(got) <= g and len(set(got)) == len(got)
    assert pool.keys() == ref.order


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(2, 4),
    g=st.integers(0, 3),
    max_keys=st.integers(1, 4),
    tokens=st.lists(st.integers(0, 5), max_size=50),
)
def test_seeding_a_prompt_is_adding_its_ngrams_one_by_one(n, g, max_keys, tokens):
    seeded, added = NGramPool(n, g, max_keys=max_keys), NGramPool(n, g, max_keys=max_keys)
    seeded.seed_from_tokens(tokens)
    for i in range(len(tokens) - n + 1):
        added.add(tokens[i], tuple(tokens[i + 1 : i + n]))
    assert seeded.keys() == added.keys()
    assert all(seeded.get_with_origin(k) == added.get_with_origin(k) for k in range(6))
