"""The step-cost seed in the real engine: before the first request the engine times forward passes of 1, 2, 4, ...
tokens (`glue/seed_timing.py`), and the sizing prices every step size from them until its own steps say otherwise.

This machine's own curve is not the one under test: each forward here is slowed as a concave curve says (a 2-core
Xeon without AVX512-BF16 in bfloat16, where the first draft tokens are the dearest), by a wrapper around the model's
logits, which every forward computes for its T rows (the start-up passes and the engine's steps alike): a forward
and its logits take at least ONE_TOKEN times the curve's multiple for T, far more than the model's own time here."""

from __future__ import annotations

import time

import pytest

from tests.conftest import make_llm

# The Xeon's bfloat16 step against the tokens it computes, as multiples of a one-token step (tests/fixtures).
CONCAVE = {
    1: 1.0,
    2: 1.32,
    3: 1.70,
    4: 2.28,
    6: 2.55,
    8: 3.19,
    12: 3.44,
    16: 4.23,
    24: 5.64,
    32: 6.51,
    48: 8.0,
    64: 10.7,
}
ONE_TOKEN = 0.15  # seconds the wrapper makes a one-token forward take at least


def _ratio(tokens: int) -> float:
    points = sorted(CONCAVE.items())
    for (t0, r0), (t1, r1) in zip(points, points[1:], strict=False):
        if tokens <= t1:
            return r0 + (r1 - r0) * (tokens - t0) / (t1 - t0)
    return points[-1][1] * tokens / points[-1][0]


@pytest.fixture
def slowed(monkeypatch):
    """Every forward of the model with its logits over T rows takes at least ONE_TOKEN * CONCAVE(T) seconds (the
    engine runs in this process: `make_llm(alone=True)`)."""
    from vllm.model_executor.models.llama import LlamaForCausalLM

    forward, logits = LlamaForCausalLM.forward, LlamaForCausalLM.compute_logits
    began = [0.0]

    def timed_forward(self, *args, **kwargs):
        began[0] = time.perf_counter()
        return forward(self, *args, **kwargs)

    def compute_logits(self, hidden_states, *args, **kwargs):
        out = logits(self, hidden_states, *args, **kwargs)
        rest = ONE_TOKEN * _ratio(hidden_states.shape[0]) - (time.perf_counter() - began[0])
        if rest > 0:
            time.sleep(rest)
        return out

    monkeypatch.setattr(LlamaForCausalLM, "forward", timed_forward)
    monkeypatch.setattr(LlamaForCausalLM, "compute_logits", compute_logits)


def test_the_engine_seeds_its_step_cost_at_start_up_and_prices_from_it(model_path, slowed):
    from vllm import SamplingParams

    llm = make_llm(model_path, alone=True, max_num_seqs=4, speculative_config={"method": "lookahead"})
    try:
        stats = llm.collective_rpc("lookahead_stats")[0]
        # before any request: the seed's points (1, 2, 4, 8 within the timing budget) follow the slowed curve
        assert stats["steps"] == 0 and stats["step_cost_seed_points"] >= 4
        one = stats["step_cost_seed_t1"]
        for t in (2, 4, 8):
            assert stats[f"step_cost_seed_t{t}"] / one == pytest.approx(CONCAVE[t], rel=0.1)
        # the sizing prices each size from the seed before any step was timed
        for t in (1, 2, 4, 8, 16):
            assert stats[f"step_cost_t{t}"] == pytest.approx(stats[f"step_cost_seed_t{t}"], rel=1e-6)
        out = llm.generate(["def fib(n):"], SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 24
        after = llm.collective_rpc("lookahead_stats")[0]
        # a size the engine's steps did not measure is never priced below the seed
        assert after["timed_steps"] > 0
        for t in (2, 4, 8, 16, 32, 64):
            assert after[f"step_cost_t{t}"] >= after[f"step_cost_seed_t{t}"] * (1 - 1e-9)
    finally:
        del llm
