"""The step-cost seed: forward passes the engine times at start-up, so that the tree sizing prices each step size
from the machine's own curve before the first request (`cost.StepCost.seed`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

logger = logging.getLogger("vllm_lookahead")

TIMED_RUNS = 3  # timed rounds over all sizes after one untimed (first-use costs); each size's fastest counts
BUDGET_SECONDS = 3.0  # sizes past this much timing are left to extrapolation (a large model on a slow machine)


def seed_sizes(largest: int) -> list[int]:
    """1, 2, 4, ... up to the first power of two at or past `largest` (the most tokens a step can compute), and
    `largest` itself if that power is past it."""
    sizes, t = [], 1
    while t < largest:
        sizes.append(t)
        t *= 2
    return [*sizes, max(int(largest), 1)]


def within_budget(sizes: list[int], seconds_of: Callable[[int], float], budget: float | None) -> list[int]:
    """The leading sizes that `budget` seconds of timing cover (None: all): each size's untimed and timed passes
    (`seconds_of`: one pass), up to the size whose passes cross the budget."""
    spent, out = 0.0, []
    for t in sizes:
        out.append(t)
        spent += (1 + TIMED_RUNS) * seconds_of(t)
        if budget is not None and spent > budget:
            break
    return out


def time_forwards(
    runner: GPUModelRunner, sizes: list[int], budget: float | None = BUDGET_SECONDS
) -> tuple[list[int], list[float]]:
    """Seconds of one forward pass computing t tokens with t rows of logits, for the leading sizes of `sizes` that
    `budget` seconds of timing cover (None: all of them), in the engine's dtype, cache layout and graph mode: vLLM's
    own dummy run (which writes no KV) as a decode batch of up to 1 + num_speculative_tokens tokens a request. One
    untimed round over the sizes (first-use costs; it also says how long each size takes), then TIMED_RUNS rounds, each
    size's fastest kept: a moment the machine is busy slows one round of a size, not all. Under tensor parallelism
    every rank must run the same passes (their collectives must match): give no budget there."""
    import torch

    with torch.inference_mode():
        kept = within_budget(sizes, lambda t: _forward(runner, t), budget)
        best = [float("inf")] * len(kept)
        for _ in range(TIMED_RUNS):
            for i, t in enumerate(kept):
                best[i] = min(best[i], _forward(runner, t))
    return kept, best


def _forward(runner: GPUModelRunner, tokens: int) -> float:
    """Seconds of one dummy forward pass of `tokens` tokens with their logits."""
    begin = time.perf_counter()
    hidden, _ = runner._dummy_run(tokens, uniform_decode=True)
    runner.model.compute_logits(hidden[:tokens])
    runner._sync_device()
    return time.perf_counter() - begin


def describe(tokens: list[int], seconds: list[float], elapsed: float) -> str:
    """The log line: the one-token pass in ms, the others as multiples of it."""
    base = seconds[0]
    shape = ", ".join(f"{t}: {s / base:.2f}x" for t, s in zip(tokens[1:], seconds[1:], strict=True))
    return f"{tokens[0]} token {1e3 * base:.1f} ms" + (f"; {shape}" if shape else "") + f" (timed in {elapsed:.1f} s)"
