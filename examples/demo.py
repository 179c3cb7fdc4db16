"""The main job: generate with vLLM + lookahead on the embedded default model; print text, tokens/s and tokens
per target forward pass.

    make demo            # or: .venv/bin/python examples/demo.py [--no-lookahead] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import os
import time

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three uses of a hash map, one line each.",
    "Explain in two sentences what speculative decoding is.",
]


def tokens_per_forward(llm) -> float | None:
    """Output tokens / target forward passes, from vLLM's speculative-decoding counters."""
    counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    generated = counters.get("vllm:generation_tokens")
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens")
    if not generated or accepted is None:
        return None
    return generated / (generated - accepted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--no-lookahead", action="store_true", help="plain decoding, for comparison")
    parser.add_argument("--config", default="{}", help="extra lookahead keys as JSON, e.g. '{\"window_size\": 6}'")
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    from vllm_lookahead.tools.models import default_model_path

    model = args.model or default_model_path()
    spec = None if args.no_lookahead else {"method": "lookahead", **json.loads(args.config)}
    llm = LLM(
        model=model,
        dtype=args.dtype,
        max_model_len=2048,
        seed=0,
        enforce_eager=True,
        speculative_config=spec,
        disable_log_stats=False,
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    llm.chat(conversations[:1], params, use_tqdm=False)  # warm-up

    start = time.perf_counter()
    outputs = llm.chat(conversations, params, use_tqdm=False)
    elapsed = time.perf_counter() - start

    n_tokens = 0
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        completion = out.outputs[0]
        n_tokens += len(completion.token_ids)
        print(f"\n### {prompt}\n{completion.text.strip()}")
    mode = "plain decoding" if args.no_lookahead else f"lookahead {json.dumps(spec)}"
    print(f"\n{mode}: {len(PROMPTS)} prompts, {n_tokens} tokens in {elapsed:.2f} s: {n_tokens / elapsed:.1f} tokens/s")
    tpf = tokens_per_forward(llm)
    print(f"tokens per target forward pass: {tpf:.2f}" if tpf else "tokens per target forward pass: 1.00")


if __name__ == "__main__":
    main()
