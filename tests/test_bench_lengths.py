"""bench_methods' output lengths (`--range-ratio`): one length for all, or a seeded spread the same for every method."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the scripts import their siblings

from bench_methods import output_lengths, parse_args, run_stem, tokens_label  # noqa: E402


def test_one_length_for_every_prompt_by_default():
    args = parse_args(["--max-tokens", "96"])
    assert output_lengths(args, 5) == [96] * 5
    assert tokens_label(args) == "96 tokens"
    assert "_r" not in run_stem(args)


def test_a_range_ratio_spreads_the_lengths_the_same_way_for_every_method():
    args = parse_args(["--max-tokens", "96", "--range-ratio", "0.5"])
    lengths = output_lengths(args, 48)
    other = parse_args(["--max-tokens", "96", "--range-ratio", "0.5", "--methods", "none"])
    assert lengths == output_lengths(other, 48)
    assert min(lengths) >= 48 and max(lengths) <= 144
    assert len(set(lengths)) > 20  # spread, not one length
    assert tokens_label(args) == "48-144 tokens"
    assert run_stem(args).endswith("_r0.5")


@pytest.mark.parametrize("ratio", ["-0.1", "1", "1.5"])
def test_a_ratio_outside_0_1_is_refused(ratio, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--range-ratio", ratio])
    assert "--range-ratio" in capsys.readouterr().err
