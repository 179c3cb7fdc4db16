"""Shared by the in-process benchmark scripts (profile_engine, ab_tree_kernel, ab_sizing, tree_calibration,
step_mix): their common options, one engine in this process on the embedded default model (eager) with a
method's speculative_config, a set's prompts as bench_methods feeds them, and a timed generation after a warm-up."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

LOOKAHEAD: dict[str, Any] = {"method": "lookahead"}


def add_common_args(p: argparse.ArgumentParser, dtype: str, dataset: str, num_prompts: int, max_tokens: int) -> None:
    p.add_argument("--dtype", default=dtype, choices=("float32", "bfloat16"))
    p.add_argument("--dataset", default=dataset, choices=("humaneval", "sharegpt"))
    p.add_argument("--num-prompts", type=int, default=num_prompts)
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--lookahead-config", default=None, help="JSON merged into lookahead's speculative_config")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """--temperature and --top-p, for the scripts whose measured batch is `timed_generate`'s."""
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above it, sampled (unseeded)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p of sampled requests (with --temperature > 0)")


def sampling_label(args: argparse.Namespace) -> str:
    """How the measured requests decode, for a result's header: greedy, or the temperature and top-p."""
    t = getattr(args, "temperature", 0.0)
    return "greedy" if t <= 0 else f"temperature {t:g}, top-p {getattr(args, 'top_p', 1.0):g}"


def sampling_params(args: argparse.Namespace) -> Any:
    """The measured requests' SamplingParams: greedy, or sampled at --temperature / --top-p (`add_sampling_args`;
    greedy in scripts without them); --max-tokens each."""
    from vllm import SamplingParams

    return SamplingParams(
        temperature=getattr(args, "temperature", 0.0), top_p=getattr(args, "top_p", 1.0), max_tokens=args.max_tokens
    )


def engine(args: argparse.Namespace, max_num_seqs: int, speculative_config: dict[str, Any] | None = LOOKAHEAD) -> Any:
    """vLLM's offline LLM in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so that a script's patches of the
    plugin's or vLLM's classes reach the engine; with `speculative_config` (None: plain decoding), lookahead's
    merged with `--lookahead-config`."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM

    from vllm_lookahead.tools.models import default_model_path

    kw: dict[str, Any] = dict(
        model=default_model_path(),
        dtype=args.dtype,
        max_model_len=2048,
        seed=0,
        enforce_eager=True,
        max_num_seqs=max_num_seqs,
    )
    if speculative_config is not None:
        if speculative_config.get("method") == "lookahead":
            speculative_config = {**speculative_config, **json.loads(args.lookahead_config or "{}")}
        kw["speculative_config"] = speculative_config
    return LLM(**kw)


def prompts(llm: Any, dataset: str, n: int) -> list[str]:
    """The first n prompts of a set: HumanEval as is, ShareGPT through the model's chat template."""
    from vllm_lookahead.tools.prompts import as_chat, humaneval_prompts, sharegpt_prompts

    if dataset == "humaneval":
        return humaneval_prompts(n)
    tokenizer = llm.get_tokenizer()
    return [as_chat(tokenizer, text) for text in sharegpt_prompts(n)]


def timed_generate(
    llm: Any, args: argparse.Namespace, concurrency: int, on_start: Callable[[], None]
) -> tuple[Any, float, int]:
    """Warms the engine on other prompts of the set (outside the measured ones: the suffix cache keeps finished
    outputs), calls `on_start`, then generates `--num-prompts` prompts (`sampling_params`: greedy unless
    --temperature), `--max-tokens` each, one at a time at concurrency 1 and all at once otherwise. Returns the
    outputs, the seconds and the tokens generated."""
    texts = prompts(llm, args.dataset, args.num_prompts + max(concurrency, 2))
    sp = sampling_params(args)
    measured, warm = texts[: args.num_prompts], texts[args.num_prompts :]
    llm.generate(warm, sp, use_tqdm=False)
    on_start()
    t0 = time.perf_counter()
    if concurrency == 1:
        outs = [o for p in measured for o in llm.generate([p], sp, use_tqdm=False)]
    else:
        outs = llm.generate(measured, sp, use_tqdm=True)
    seconds = time.perf_counter() - t0
    return outs, seconds, sum(len(o.outputs[0].token_ids) for o in outs)
