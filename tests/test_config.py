import dataclasses

import pytest

from vllm_lookahead.core.params import PATH, LookaheadParams
from vllm_lookahead.core.tree import window_slots_max


def test_defaults():
    p = LookaheadParams()
    assert (p.window_size, p.ngram_size, p.guess_set_size) == (4, 3, 4)
    assert p.pool_from_prompt is True
    assert p.lookahead_seed == 0
    assert p.max_pool_keys == 4096
    assert p.max_tree_nodes == 8 + 8 + 8 + 16 + 16  # window, pool, lookup, suffix, recycling


def test_every_field_has_a_range_or_is_a_bool_and_a_meaning():
    for f in dataclasses.fields(LookaheadParams):
        rng = f.metadata["range"]
        assert f.metadata["help"]
        if rng is None:
            assert isinstance(f.default, bool), f.name
        elif rng == PATH:
            assert f.default is None, f.name
        elif f.default is not None:
            assert rng[0] <= f.default <= rng[1], f.name


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.5, 10.5, "0.1", True, [0.1]])
def test_node_cost_is_null_or_a_number_in_range(bad):
    assert LookaheadParams(node_cost=0.03).node_cost == 0.03
    assert LookaheadParams(node_cost=0).node_cost == 0
    with pytest.raises(ValueError, match=r"node_cost must be null or a number in \[0.0, 10.0\]"):
        LookaheadParams(node_cost=bad)


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
        (
            {"lookahead_seed": -1},
            "lookahead: lookahead_seed must be an integer in [0, 9223372036854775807] (got -1)",
        ),
        (
            {"lookahead_seed": True},
            "lookahead: lookahead_seed must be an integer in [0, 9223372036854775807] (got True)",
        ),
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
        {"lookahead_seed": 2**63 - 1, "max_pool_keys": 1, "pool_from_prompt": False},
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


def test_from_mapping_null_means_default():
    p = LookaheadParams.from_mapping({"window_size": 5, "ngram_size": None, "lookahead_seed": 9})
    assert (p.window_size, p.ngram_size, p.lookahead_seed) == (5, 3, 9)
    assert LookaheadParams.from_mapping({}) == LookaheadParams()
    assert LookaheadParams.from_mapping(dict.fromkeys(LookaheadParams.keys())) == LookaheadParams()


def test_from_mapping_rejects_unknown_keys_listing_allowed():
    with pytest.raises(ValueError) as err:
        LookaheadParams.from_mapping({"window": 3, "window_size": 3, "guess": 1})
    assert str(err.value) == "lookahead: unknown key(s) guess, window; allowed keys: " + ", ".join(
        LookaheadParams.keys()
    )
    assert LookaheadParams.keys()[:3] == ("window_size", "ngram_size", "guess_set_size")


def test_from_mapping_validates_values():
    with pytest.raises(ValueError, match=r"ngram_size must be an integer in \[2, 16\] \(got 1\)"):
        LookaheadParams.from_mapping({"ngram_size": 1})


@pytest.mark.parametrize("w, n, g", [(7, 4, 7), (15, 5, 15), (1, 2, 0), (3, 5, 3), (1, 16, 64)])
def test_max_tree_nodes(w, n, g):
    p = LookaheadParams(window_size=w, ngram_size=n, guess_set_size=g)
    lookup = p.lookup_candidates * p.lookup_len + p.suffix_candidates + p.recycle_candidates
    assert p.max_tree_nodes == window_slots_max(w, n) + g * (n - 1) + lookup
    bare = LookaheadParams(w, n, g, lookup_candidates=0, suffix_candidates=0, recycle_candidates=0)
    assert bare.max_tree_nodes == p.max_tree_nodes - lookup
    steady = 1 + (w * (n - 1) - 1) + g * (n - 1)
    if w >= n - 2:
        assert p.max_tree_nodes - lookup == steady
    else:
        # A narrow, deep window is bigger during warm-up than in steady state.
        assert p.max_tree_nodes - lookup > steady
