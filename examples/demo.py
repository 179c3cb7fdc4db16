"""The main job: generate with vLLM on the embedded default model and print the text and tokens/s.

make demo            # or: .venv/bin/python examples/demo.py [--no-lookahead] [--dtype float32]
"""

from __future__ import annotations

import argparse
import os
import time

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three uses of a hash map, one line each.",
    "Explain in two sentences what speculative decoding is.",
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    from vllm_lookahead.models import default_model_path

    model = args.model or default_model_path()
    llm = LLM(model=model, dtype=args.dtype, max_model_len=2048, seed=0, enforce_eager=True)
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
    print(
        f"\n{len(PROMPTS)} prompts, {n_tokens} tokens in {elapsed:.2f} s: {n_tokens / elapsed:.1f} tokens/s"
    )


if __name__ == "__main__":
    main()
