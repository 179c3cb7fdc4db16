"""A request's own lookahead settings (SamplingParams.extra_args["lookahead"]): parsed, bounded by the server's
values, refused by key name, and honoured by the per-request state. No engine is started here."""

from __future__ import annotations

import json

import pytest
from vllm import SamplingParams

from vllm_lookahead.core.params import REQUEST_KEYS, LookaheadParams, RequestSettingsError
from vllm_lookahead.core.pool import NGramPool
from vllm_lookahead.core.state import LookaheadState
from vllm_lookahead.glue.eligibility import ineligible_reason, request_params, request_settings

SERVER = LookaheadParams(window_size=4, ngram_size=3, guess_set_size=4, shared_pool_keys=64)


def _sp(value=None, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=8, extra_args=None if value is None else {"lookahead": value}, **kw)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, True),  # no extra_args at all
        (True, True),
        (1, True),  # vllm_xargs' true
        (False, False),
        (0, False),  # vllm_xargs' false
        ({}, {}),
        ({"window_size": 2}, {"window_size": 2}),
        ('{"window_size": 2}', {"window_size": 2}),  # vllm_xargs' JSON string
        ("false", False),
    ],
)
def test_request_settings_forms(value, expected):
    assert request_settings(_sp(value)) == expected


@pytest.mark.parametrize("value", [2, -1, 0.0, 1.5, "{not json", "[1, 2]", [1], "null-ish"])
def test_request_settings_refuses_other_values(value):
    with pytest.raises(RequestSettingsError) as e:
        request_settings(_sp(value))
    assert e.value.key == "extra_args.lookahead"


def test_for_request_applies_keys_within_the_servers_values():
    got = SERVER.for_request({"window_size": 2, "ngram_size": 2, "guess_set_size": 0, "pool_from_output": False})
    assert (got.window_size, got.ngram_size, got.guess_set_size, got.pool_from_output) == (2, 2, 0, False)
    assert got.step_token_budget == SERVER.step_token_budget and got.shared_pool_keys == SERVER.shared_pool_keys
    assert got.max_tree_nodes <= SERVER.max_tree_nodes
    assert SERVER.for_request({}) is SERVER
    assert SERVER.for_request({"window_size": None}).window_size == SERVER.window_size  # null: the server's
    assert SERVER.for_request({"lookahead_seed": 2**40}).lookahead_seed == 2**40  # the seed is not capped
    # Every request key at the server's own value is accepted and changes nothing.
    assert SERVER.for_request({k: getattr(SERVER, k) for k in REQUEST_KEYS}) == SERVER


@pytest.mark.parametrize(
    ("given", "key", "message"),
    [
        ({"window_size": 5}, "window_size", r"window_size must be an integer in \[1, 4\] \(at most the server"),
        ({"window_size": 0}, "window_size", r"in \[1, 4\] .*\(got 0\)"),
        ({"ngram_size": 4}, "ngram_size", r"in \[2, 3\]"),
        ({"guess_set_size": -1}, "guess_set_size", r"in \[0, 4\]"),
        ({"lookup_len": 9}, "lookup_len", r"in \[1, 8\]"),
        ({"suffix_candidates": 17}, "suffix_candidates", r"in \[0, 16\]"),
        ({"window_size": 2.0}, "window_size", r"must be an integer"),
        ({"window_size": True}, "window_size", r"must be an integer"),
        ({"window_size": "2"}, "window_size", r"must be an integer"),
        ({"pool_from_prompt": 1}, "pool_from_prompt", r"must be a bool"),
        ({"lookahead_seed": -1}, "lookahead_seed", r"lookahead_seed must be an integer in \[0, \d+\] \(got -1\)"),
        ({"step_token_budget": 8}, "step_token_budget", r"engine-wide \(set it in speculative_config\)"),
        ({"node_cost": 0.1}, "node_cost", r"engine-wide"),
        ({"bogus": 1}, "bogus", r"bogus is not a key; a request may set: window_size"),
    ],
)
def test_for_request_refuses_by_key(given, key, message):
    with pytest.raises(RequestSettingsError, match=message) as e:
        SERVER.for_request(given)
    assert e.value.key == f"extra_args.lookahead.{key}"
    assert isinstance(e.value, ValueError)


def test_for_request_refuses_a_non_object():
    with pytest.raises(RequestSettingsError, match="must be false, true or an object"):
        SERVER.for_request([("window_size", 2)])


def test_request_params_and_eligibility():
    assert request_params(SERVER, _sp()) is SERVER
    assert request_params(SERVER, _sp(False)) is None
    assert request_params(SERVER, _sp(json.dumps({"window_size": 1}))).window_size == 1
    assert ineligible_reason(_sp({"window_size": 1}), server=SERVER) is None
    assert "opted out" in ineligible_reason(_sp(0), server=SERVER)
    reason = ineligible_reason(_sp({"window_size": 99}), server=SERVER)
    assert "invalid" in reason and "extra_args.lookahead.window_size" in reason
    # Without the server's values only the form is checked; the plain path ignores the settings.
    assert ineligible_reason(_sp({"window_size": 99})) is None
    assert ineligible_reason(_sp("{bad"), honour_opt_out=False) is None


def test_state_runs_with_the_requests_settings():
    prompt = [5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 10] * 3
    shared = NGramPool(SERVER.ngram_size, SERVER.guess_set_size, SERVER.shared_pool_keys)
    shared.add_many([(5, (6, 7)), (5, (6, 8)), (5, (6, 9)), (5, (1, 2)), (5, (3, 4))])
    small = SERVER.for_request({"window_size": 1, "guess_set_size": 1, "lookup_candidates": 0})
    state = LookaheadState(small, prompt, shared=shared)
    tree = state.build_tree(5)
    assert tree.num_nodes <= small.max_tree_nodes < SERVER.max_tree_nodes
    full = LookaheadState(SERVER, prompt, shared=shared).build_tree(5)
    assert tree.num_nodes < full.num_nodes
    # A request with its own n-gram size does not use the server's shared pool (its n-grams are of another size).
    assert LookaheadState(SERVER.for_request({"ngram_size": 2}), prompt, shared=shared).shared is None
    assert LookaheadState(small, prompt, shared=shared).shared is shared
