"""The step-cost seed in the real engine: before the first request the engine times forward passes of 1, 2, 4, ...
tokens (`glue/seed_timing.py`), and the sizing prices every step size from them until its own steps say otherwise.

This machine's own curve is not the one under test: in the engine's worker, each forward is then slowed as a concave
curve says (a 2-core Xeon without AVX512-BF16 in bfloat16, where the first draft tokens are the dearest), by a
wrapper around the model's logits, which every forward computes for its T rows (the start-up passes and the engine's
steps alike), and the engine's own warm-up (what vLLM's warm-up hook runs) is run again: a forward and its logits
take at least ONE_TOKEN times the curve's multiple for T, far more than the model's own time here."""

from __future__ import annotations

import pytest

from tests.conftest import make_llm

# The Xeon's bfloat16 step against the tokens it computes, as multiples of a one-token step (tests/fixtures).
CONCAVE = {1: 1.0, 2: 1.32, 3: 1.70, 4: 2.28, 6: 2.55, 8: 3.19, 12: 3.44, 16: 4.23, 24: 5.64, 32: 6.51}
ONE_TOKEN = 0.15  # seconds the wrapper makes a one-token forward take at least


def _slow_down_and_warm_up_again(worker) -> None:
    """Run in the worker: every forward of the model with its logits over T rows takes at least ONE_TOKEN times
    CONCAVE's multiple for T; then the engine's warm-up again."""
    import time

    from vllm.model_executor.models.llama import LlamaForCausalLM

    from vllm_lookahead.glue.patches.model_runner import engine_of

    points = sorted(CONCAVE.items())

    def ratio(tokens: int) -> float:
        for (t0, r0), (t1, r1) in zip(points, points[1:], strict=False):
            if tokens <= t1:
                return r0 + (r1 - r0) * (tokens - t0) / (t1 - t0)
        return points[-1][1] * tokens / points[-1][0]

    forward, logits = LlamaForCausalLM.forward, LlamaForCausalLM.compute_logits
    began = [0.0]

    def timed_forward(self, *args, **kwargs):
        began[0] = time.perf_counter()
        return forward(self, *args, **kwargs)

    def compute_logits(self, hidden_states, *args, **kwargs):
        out = logits(self, hidden_states, *args, **kwargs)
        rest = ONE_TOKEN * ratio(hidden_states.shape[0]) - (time.perf_counter() - began[0])
        if rest > 0:
            time.sleep(rest)
        return out

    LlamaForCausalLM.forward, LlamaForCausalLM.compute_logits = timed_forward, compute_logits
    engine_of(worker.model_runner).warm_up(worker.model_runner)


@pytest.fixture
def llm(model_path):
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a test function
    # 4 requests: a few seed sizes (1 to 224 tokens, what a dummy decode batch of 4 holds), the first one cut short
    llm = make_llm(model_path, max_num_seqs=4, speculative_config={"method": "lookahead"})
    yield llm
    del llm
    mp.undo()


def test_the_engine_seeds_its_step_cost_at_start_up_and_prices_from_it(llm):
    from vllm import SamplingParams

    # at start-up, before any request: the seed is taken (the worker patch ran the engine's warm-up)
    started = llm.collective_rpc("lookahead_stats")[0]
    assert started["steps"] == 0 and started["step_cost_seed_points"] >= 4
    llm.collective_rpc(_slow_down_and_warm_up_again)
    stats = llm.collective_rpc("lookahead_stats")[0]
    # the seed's points (1, 2, 4, 8, ... within the timing budget) follow the slowed curve
    assert stats["step_cost_seed_points"] >= 4
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
