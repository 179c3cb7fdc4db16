"""The sizing against every machine the project has measured, without the machines: the engine's own drafting and
sizing replayed on recorded greedy chat and code runs (`fixtures/replay_sequences.json.gz`), charged by each
machine's step-cost curve (`fixtures/step_costs.json`: CPUs with and without AVX512-BF16 or AMX, AVX2, GPUs), at one
request and at sixteen in flight. On every curve its tokens per second are at least BAR of the best of plain decoding
and of every fixed tree size (in hindsight), over the whole run and over the first FIRST steps of fresh engines
(ROTATIONS runs, each starting at another request, summed): the step cost starts from the start-up seed alone.
(`devtools/sizing_replay.py`; the table and plot: `benchmarks/replay_sizing.py`.)"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.devtools.sizing_replay import SIZED, Curve, Trace, load_curves, load_sequences, replay

FIXTURES = Path(__file__).parent / "fixtures"
CURVES = load_curves(FIXTURES / "step_costs.json")
FIXED = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)  # draft nodes a request carries each step (0: plain decoding)
REQUESTS = {1: 8, 16: 24}  # requests replayed at each concurrency
FIRST = 20
ROTATIONS = 8
BAR = 0.98


@functools.cache
def _sequences() -> dict:
    return load_sequences(FIXTURES / "replay_sequences.json.gz")


def _runs(dataset: str, concurrency: int) -> tuple[list, list[list]]:
    """The whole run's requests, and ROTATIONS request orders for the first steps."""
    pool = _sequences()[dataset]
    n = REQUESTS[concurrency]
    step = len(pool) // ROTATIONS
    return pool[:n], [(pool[i * step :] + pool[: i * step])[:n] for i in range(ROTATIONS)]


@functools.cache
def _fixed(dataset: str, concurrency: int) -> dict[int, tuple[Trace, list[Trace]]]:
    """Each fixed size's whole run and first steps (they do not depend on the curve: priced under each)."""
    params = LookaheadParams()
    whole, rotations = _runs(dataset, concurrency)
    return {
        k: (replay(whole, params, concurrency, k), [replay(r, params, concurrency, k, steps=FIRST) for r in rotations])
        for k in FIXED
    }


def _rate(traces: list[Trace], curve: Curve) -> float:
    return sum(sum(t.emitted) for t in traces) / sum(sum(t.seconds(curve)) for t in traces)


@pytest.mark.parametrize("concurrency", [1, 16])
@pytest.mark.parametrize("dataset", ["code", "chat"])
@pytest.mark.parametrize("curve", CURVES, ids=[c.name.replace(" ", "-") for c in CURVES])
def test_the_sizing_keeps_up_with_plain_decoding_and_every_fixed_tree(curve, dataset, concurrency):
    params = LookaheadParams()
    whole, rotations = _runs(dataset, concurrency)
    fixed = _fixed(dataset, concurrency)
    sized = replay(whole, params, concurrency, SIZED, curve)
    first = [replay(r, params, concurrency, SIZED, curve, steps=FIRST) for r in rotations]
    for label, ours, theirs in (
        ("whole run", sized.rate(curve), {k: w.rate(curve) for k, (w, _) in fixed.items()}),
        (f"first {FIRST} steps", _rate(first, curve), {k: _rate(f, curve) for k, (_, f) in fixed.items()}),
    ):
        best = max(theirs, key=theirs.get)
        assert ours >= BAR * theirs[best], (
            f"{label}: sized {ours / theirs[0]:.3f}x plain decoding, fixed size {best} {theirs[best] / theirs[0]:.3f}x"
        )


def test_the_replay_reproduces_every_output_and_plain_decoding_makes_a_token_a_step():
    params = LookaheadParams()
    whole, _ = _runs("code", 16)
    plain = replay(whole, params, 16, 0)
    assert sum(plain.emitted) == sum(plain.requests) == sum(len(r[1]) - 1 for r in whole)
    assert max(plain.requests) == 16
    sized = replay(whole, params, 16, SIZED, CURVES[0])  # (raises where an output differs)
    assert sum(sized.emitted) == sum(plain.emitted) and len(sized.emitted) < len(plain.emitted)
    assert replay(whole, params, 16, SIZED, CURVES[0], steps=5).requests == sized.requests[:5]


def test_a_curve_prices_request_counts_between_and_past_its_rows():
    """Linear in R between measured rows; past a row's last token count, as the next row measured there rises."""
    curve = Curve("t", {1: ((1, 10.0), (4, 13.0)), 16: ((16, 20.0), (64, 68.0))}, per_request=0.5)
    assert curve.forward(1, 2) == pytest.approx(0.011)
    assert curve.forward(16, 40) == pytest.approx(0.044)
    assert curve.forward(1, 40) == pytest.approx((13.0 + 40 - 16) / 1e3)  # from 16 on, as the row of 16 rises
    assert curve.forward(4, 16) == pytest.approx((13.0 + (20.0 - 13.0) * 3 / 15) / 1e3)
    assert curve.forward(20, 64) == pytest.approx((68.0 + 0.5 * 10.0 * 4) / 1e3)
