import dataclasses

import pytest

from vllm_lookahead.config import (
    DEFAULT_GUESS_SET_SIZE,
    DEFAULT_NGRAM_SIZE,
    DEFAULT_WINDOW_SIZE,
    LookaheadParams,
)
from vllm_lookahead.tree import max_tree_size, steady_tree_size


def test_defaults():
    p = LookaheadParams()
    assert (p.window_size, p.ngram_size, p.guess_set_size) == (
        DEFAULT_WINDOW_SIZE,
        DEFAULT_NGRAM_SIZE,
        DEFAULT_GUESS_SET_SIZE,
    )
    assert p.pool_from_prompt is True
    assert p.seed == 0
    assert p.max_pool_keys == 4096


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"window_size": 0}, "lookahead: window_size must be an integer in [1, 64] (got 0)"),
        ({"window_size": 65}, "lookahead: window_size must be an integer in [1, 64] (got 65)"),
        ({"window_size": True}, "lookahead: window_size must be an integer in [1, 64] (got True)"),
        ({"window_size": 3.0}, "lookahead: window_size must be an integer in [1, 64] (got 3.0)"),
        ({"window_size": "3"}, "lookahead: window_size must be an integer in [1, 64] (got '3')"),
        ({"ngram_size": 1}, "lookahead: ngram_size must be an integer in [2, 16] (got 1)"),
        ({"ngram_size": 17}, "lookahead: ngram_size must be an integer in [2, 16] (got 17)"),
        ({"ngram_size": False}, "lookahead: ngram_size must be an integer in [2, 16] (got False)"),
        ({"guess_set_size": -1}, "lookahead: guess_set_size must be an integer in [0, 64] (got -1)"),
        ({"guess_set_size": 65}, "lookahead: guess_set_size must be an integer in [0, 64] (got 65)"),
        ({"guess_set_size": None}, "lookahead: guess_set_size must be an integer in [0, 64] (got None)"),
        ({"pool_from_prompt": 1}, "lookahead: pool_from_prompt must be a bool (got 1)"),
        ({"pool_from_prompt": "yes"}, "lookahead: pool_from_prompt must be a bool (got 'yes')"),
        ({"seed": -1}, "lookahead: seed must be an integer in [0, 9223372036854775807] (got -1)"),
        ({"seed": True}, "lookahead: seed must be an integer in [0, 9223372036854775807] (got True)"),
        ({"max_pool_keys": 0}, "lookahead: max_pool_keys must be an integer in [1, 1048576] (got 0)"),
        (
            {"max_pool_keys": 2**20 + 1},
            "lookahead: max_pool_keys must be an integer in [1, 1048576] (got 1048577)",
        ),
    ],
)
def test_invalid_values_name_parameter_and_range(kwargs, message):
    with pytest.raises(ValueError) as err:
        LookaheadParams(**kwargs)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window_size": 1, "ngram_size": 2, "guess_set_size": 0},
        {"window_size": 64, "ngram_size": 16, "guess_set_size": 64},
        {"seed": 2**63 - 1, "max_pool_keys": 1, "pool_from_prompt": False},
    ],
)
def test_boundaries_accepted(kwargs):
    p = LookaheadParams(**kwargs)
    for k, v in kwargs.items():
        assert getattr(p, k) == v


def test_frozen():
    p = LookaheadParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.window_size = 3  # type: ignore[misc]


def test_from_dict_roundtrip_and_none():
    p = LookaheadParams.from_dict({"window_size": 5, "ngram_size": 3, "guess_set_size": 2, "seed": 9})
    assert (p.window_size, p.ngram_size, p.guess_set_size, p.seed) == (5, 3, 2, 9)
    assert LookaheadParams.from_dict(p.to_dict()) == p
    assert LookaheadParams.from_dict(None) == LookaheadParams()
    assert LookaheadParams.from_dict({}) == LookaheadParams()


def test_from_dict_rejects_unknown_keys_listing_allowed():
    with pytest.raises(ValueError) as err:
        LookaheadParams.from_dict({"window": 3, "window_size": 3, "guess": 1})
    assert str(err.value) == (
        "lookahead: unknown config key(s) guess, window; allowed keys: window_size, ngram_size, "
        "guess_set_size, pool_from_prompt, pool_from_output, lookup_candidates, lookup_len, step_token_budget, "
        "seed, max_pool_keys"
    )


def test_from_dict_validates_values():
    with pytest.raises(ValueError, match=r"ngram_size must be an integer in \[2, 16\] \(got 1\)"):
        LookaheadParams.from_dict({"ngram_size": 1})


def test_from_dict_rejects_non_mapping():
    with pytest.raises(ValueError, match="lookahead: config must be a mapping"):
        LookaheadParams.from_dict([("window_size", 3)])  # type: ignore[arg-type]


@pytest.mark.parametrize("w, n, g", [(7, 4, 7), (15, 5, 15), (1, 2, 0), (3, 5, 3), (1, 16, 64)])
def test_tree_size(w, n, g):
    p = LookaheadParams(window_size=w, ngram_size=n, guess_set_size=g)
    lookup = p.lookup_candidates * p.lookup_len
    assert p.tree_size == max_tree_size(w, n, g) + lookup
    assert LookaheadParams(w, n, g, lookup_candidates=0).tree_size == max_tree_size(w, n, g)
    if w >= n - 2:
        assert p.tree_size - lookup == 1 + (w * (n - 1) - 1) + g * (n - 1) == steady_tree_size(w, n, g)
    else:
        # A narrow, deep window is bigger during warm-up than in steady state.
        assert p.tree_size - lookup > steady_tree_size(w, n, g)
