"""`method: "lookahead"` in vLLM's SpeculativeConfig: defaults, clear start-up errors, the CLI shorthand, and a
plugin that is inert for everything else (no engine is started here)."""

from __future__ import annotations

import pytest

from vllm_lookahead import plugin
from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.glue import patches


@pytest.fixture(autouse=True)
def _patched():
    plugin.register()
    patches.apply_all()
    yield
    patches.apply_all()


def _sc(**kw):
    from vllm.config.speculative import SpeculativeConfig

    return SpeculativeConfig(**kw)


def test_defaults_derive_num_speculative_tokens():
    cfg = _sc(method="lookahead")
    params = LookaheadParams()
    assert cfg.method == "lookahead"
    assert cfg.num_speculative_tokens == params.max_tree_nodes - 1
    cfg = _sc(method="lookahead", window_size=4, ngram_size=3, guess_set_size=2, pool_from_prompt=False)
    # x0 + window (4 columns of 2 rows, less the first cell) + pool 2x2 + 1 lookup of 8 + 16 suffix nodes + 16
    # recycled nodes, less x0.
    assert cfg.num_speculative_tokens == 1 + (4 * 2 - 1) + 2 * 2 + 1 * 8 + 16 + 16 - 1
    assert cfg.window_size == 4 and cfg.pool_from_prompt is False


def test_shorthand_model_selects_lookahead():
    assert _sc(model="[lookahead]").method == "lookahead"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"window_size": 0}, r"window_size must be an integer in \[1, 64\] \(got 0\)"),
        ({"ngram_size": 1}, r"ngram_size must be an integer in \[2, 16\]"),
        ({"guess_set_size": -1}, r"guess_set_size must be an integer in \[0, 64\]"),
        ({"pool_from_prompt": "yes"}, r"pool_from_prompt must be a bool"),
        ({"window_size": 2.5}, r"window_size must be an integer"),
        ({"num_speculative_tokens": 3}, r"num_speculative_tokens must be in \[55, 128\] .* \(got 3\)"),
        ({"num_speculative_tokens": 129}, r"num_speculative_tokens must be in \[55, 128\]"),
        ({"suffix_candidates": 65}, r"suffix_candidates must be an integer in \[0, 64\]"),
        ({"recycle_candidates": -1}, r"recycle_candidates must be an integer in \[0, 64\]"),
        ({"node_cost": -1}, r"node_cost must be null or a number in \[0.0, 10.0\]"),
        ({"lookahead_seed": -1}, r"lookahead_seed must be an integer in \[0, "),
        ({"window_size": 20, "ngram_size": 8}, r"more than vLLM's limit of 128"),
        ({"lookup_len": 0}, r"lookup_len must be an integer in \[1, 32\]"),
        ({"bogus": 1}, r"bogus\s+Unexpected keyword argument"),
        ({"suffix_corpus": "no/such/corpus.jsonl"}, r"suffix_corpus must be null or the path of an existing file"),
    ],
)
def test_bad_config_fails_with_a_message_naming_the_field(kw, message):
    with pytest.raises(Exception, match=message):
        _sc(method="lookahead", **kw)


def test_lookahead_keys_are_refused_for_other_methods():
    with pytest.raises(Exception, match="window_size only apply to method 'lookahead'"):
        _sc(method="ngram", num_speculative_tokens=3, window_size=3)
    assert _sc(method="ngram", num_speculative_tokens=3).method == "ngram"


def test_null_key_takes_the_default():
    assert _sc(method="lookahead", ngram_size=None).num_speculative_tokens == LookaheadParams().max_tree_nodes - 1


def test_every_key_of_the_params_is_a_config_key():
    cfg = _sc(method="lookahead", **{k: getattr(LookaheadParams(), k) for k in LookaheadParams.keys()})
    assert cfg.method == "lookahead"


def test_tree_limit_is_vllms_own():
    from vllm.v1.sample.rejection_sampler import MAX_SPEC_LEN

    # A tree of exactly vLLM's limit (9 window and pool drafts + 7 lookups of 17 tokens), then one over it.
    shape = {
        "window_size": 4,
        "ngram_size": 3,
        "guess_set_size": 1,
        "lookup_candidates": 7,
        "suffix_candidates": 0,
        "recycle_candidates": 0,
    }
    assert MAX_SPEC_LEN == 128
    assert _sc(method="lookahead", lookup_len=17, **shape).num_speculative_tokens == MAX_SPEC_LEN
    with pytest.raises(Exception, match=f"135 draft tokens, more than vLLM's limit of {MAX_SPEC_LEN}"):
        _sc(method="lookahead", lookup_len=18, **shape)


def test_cli_flags(model_path):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    for argv in (
        ["--speculative-model", "[lookahead]"],
        ["--spec-model", "[lookahead]"],
        ["--speculative-config", '{"method": "lookahead", "window_size": 3}'],
    ):
        args = parser.parse_args(["--model", model_path, "--max-model-len", "512", *argv])
        engine_args = EngineArgs.from_cli_args(args)
        cfg = engine_args.create_engine_config()
        assert cfg.speculative_config.method == "lookahead", argv


def test_patches_are_revertible_and_inert_when_reverted():
    from vllm.config.speculative import SpeculativeConfig
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    names = set(patches.applied())
    assert {"speculative_config.__post_init__", "runner._sample", "cpu_attn.CPUAttentionBackendImpl.forward"} <= names
    patched_sample = GPUModelRunner._sample
    assert hasattr(CPUAttentionBackendImpl.forward, "__wrapped__")
    assert patches.original("runner._sample") is not patched_sample
    patches.revert_all()
    assert patches.applied() == []
    assert GPUModelRunner._sample is not patched_sample
    assert not hasattr(CPUAttentionBackendImpl.forward, "__wrapped__")
    with pytest.raises(Exception, match="Input should be"):
        SpeculativeConfig(method="lookahead")
    assert not hasattr(SpeculativeConfig, "window_size")
    patches.apply_all()
    assert GPUModelRunner._sample is not patches.original("runner._sample")
    assert SpeculativeConfig(method="lookahead").method == "lookahead"


def _fuzz_cases():
    """Every key with a wrong type, a negative, a huge value and NaN: (key, value, the message expected)."""
    import dataclasses
    import re

    cases = []
    for f in dataclasses.fields(LookaheadParams):
        rng = f.metadata["range"]
        if rng is None:
            expected = rf"{f.name} must be a bool"
        elif rng == "path":
            expected = rf"{f.name} must be null or the path of an existing file"
        elif isinstance(rng[0], float):
            expected = rf"{f.name} must be null or a number in \[{rng[0]}, {rng[1]}\]"
        else:
            expected = rf"{f.name} must be an integer in \[{rng[0]}, {rng[1]}\]"
        for value in ("x", [1], {"a": 1}, -1, 2**64, float("nan"), float("-inf")):
            cases.append(pytest.param(f.name, value, expected, id=f"{f.name}={re.sub(r'[^a-z0-9-]', '', repr(value))}"))
    return cases


@pytest.mark.parametrize(("key", "value", "message"), _fuzz_cases())
def test_config_fuzz_names_the_key_and_its_range(key, value, message):
    with pytest.raises(Exception, match=message) as err:
        _sc(method="lookahead", **{key: value})
    assert str(err.value).count("lookahead:") == 1  # one message, not a cascade


@pytest.mark.parametrize("text", ["[1, 2]", '"lookahead"', "3"])
def test_speculative_config_that_is_not_a_json_object_is_refused(model_path, text):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", model_path, "--max-model-len", "512", "--speculative-config", text])
    with pytest.raises(ValueError, match=r"speculative_config \(--speculative-config\) must be a JSON object"):
        EngineArgs.from_cli_args(args).create_engine_config()
    # Text that is not JSON at all: vLLM's parser refuses it, naming the flag.
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", model_path, "--speculative-config", "{not json"])
