"""Where a vLLM engine's memory goes under varied traffic: RSS against the number of distinct step sizes it has run.

    python benchmarks/research/rss_by_step_size.py               # plain decoding, prompts of 3..399 tokens, 3 rounds
    python benchmarks/research/rss_by_step_size.py --lookahead   # the same with lookahead

One engine in this process (float32, eager, no prefix caching) prefills prompts one at a time, each of a length it
has not run before (every prefill is a step of that many tokens), and prints the process's RSS after each group;
then it runs the same lengths again (rounds 2 and 3). On CPU, vLLM's linear layers keep a oneDNN primitive per
distinct number of rows (32 sizes per layer, `create_onednn_mm(..., 32)`), and oneDNN keeps up to
`ONEDNN_PRIMITIVE_CACHE_CAPACITY` primitives (default 1024) process-wide besides, so RSS grows with each new step size
in the first round and stays level when sizes repeat: the growth a serving soak shows is bounded by those caches,
and lookahead, whose steps carry varied numbers of tokens, reaches the same ceiling sooner, not a higher one. Run it
with `ONEDNN_PRIMITIVE_CACHE_CAPACITY=8` in the environment to see the process-wide cache's share.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, so its RSS is ours
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lookahead", action="store_true", help="lookahead on (default: plain decoding)")
    p.add_argument("--lengths", default="3:400:3", help="prompt lengths start:stop:step")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    start, stop, step = (int(x) for x in args.lengths.split(":"))
    lengths = list(range(start, stop, step))

    import psutil
    from vllm import LLM, SamplingParams

    from vllm_lookahead.devtools.models import default_model_path

    llm = LLM(
        default_model_path(), dtype="float32", enforce_eager=True, max_model_len=512, enable_prefix_caching=False,
        speculative_config={"method": "lookahead"} if args.lookahead else None, seed=0,
    )  # fmt: skip
    proc = psutil.Process()

    def rss() -> float:
        return proc.memory_info().rss / 2**20

    sp = SamplingParams(max_tokens=4, temperature=0)
    base = rss()
    print("| round | prompt lengths | new step sizes so far | RSS (MiB) | growth (MiB) |\n|---|---|---|---|---|")
    print(f"| - | (engine up) | 0 | {base:.0f} | 0 |")
    group = 33
    for rnd in range(1, args.rounds + 1):
        for j in range(0, len(lengths), group):
            part = lengths[j : j + group]
            for i, n in enumerate(part):  # one at a time: each prefill is a step of n tokens
                llm.generate([{"prompt_token_ids": [100 + (i % 50)] * n}], sp, use_tqdm=False)
            seen = min(len(lengths), j + len(part)) if rnd == 1 else len(lengths)
            print(f"| {rnd} | {part[0]}..{part[-1]} | {seen} | {rss():.0f} | {rss() - base:+.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
