"""What the engine's shared suffix trees cost in memory per cached token, and what `suffix_cache_requests` allows.

    python benchmarks/diagnostics/suffix_cache_memory.py
    python benchmarks/diagnostics/suffix_cache_memory.py --depths 24,64 --requests 2000

Lookahead keeps one global suffix tree per engine over finished requests' outputs (`suffix_cache_requests`, default
10000, as vLLM's `suffix` method), so that later requests can continue what earlier ones wrote. Its size is bounded
in requests, not bytes: the bytes follow the outputs' lengths. This caches `--requests` outputs (real text: the
HumanEval and ShareGPT prompts of the project's sets, tokenized by the default model's tokenizer, taken in turn)
through the plugin's own `SuffixCandidates`, and prints, per tree depth (`suffix_depth`), the tokens the shared tree
holds (what `lookahead_stats` reports as `suffix_cached_tokens`) and the process's RSS growth per held token (memory
the process had freed before absorbs the first megabytes: give each depth its own run for a clean figure), and what
the default number of cached requests takes at a few output lengths. No model runs.
"""

from __future__ import annotations

import argparse
import sys


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--depths", default="24", help="comma list of suffix_depth values")
    p.add_argument("--requests", type=int, default=6000, help="outputs cached per depth")
    p.add_argument("--lengths", default="128,512,2048", help="output lengths for the projection")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.core.suffix import SuffixCandidates
    from vllm_lookahead.devtools.models import default_model_path
    from vllm_lookahead.devtools.prompts import humaneval_prompts, sharegpt_prompts

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    texts = humaneval_prompts() + sharegpt_prompts(500)
    outputs = [tokenizer(t)["input_ids"] for t in texts]
    cached = LookaheadParams().suffix_cache_requests
    print(f"{len(outputs)} texts, {sum(map(len, outputs)) / len(outputs):.0f} tokens each on average\n")
    print("| suffix_depth | requests held | tokens held | RSS growth, MiB | bytes per token |")
    print("|---|---|---|---|---|")
    per_token = {}
    for depth in (int(d) for d in args.depths.split(",")):
        sc = SuffixCandidates.create(depth, args.requests)
        if sc is None:
            print("arctic_inference is not installed", file=sys.stderr)
            return 2
        before = rss_mib()
        for i in tqdm(range(args.requests), desc=f"depth {depth}", unit="request", leave=False):
            # each request's own token ids, so that repeated texts are not shared for free
            out = [(t + i * 7919) % tokenizer.vocab_size for t in outputs[i % len(outputs)]]
            sc.start(i, out[:8])
            sc.extend(i, out)
            sc.stop(i)
        grown, tokens = rss_mib() - before, sc.cached_tokens()
        per_token[depth] = grown * 2**20 / tokens
        print(f"| {depth} | {sc.cached_requests()} | {tokens} | {grown:.0f} | {per_token[depth]:.0f} |")
        del sc
    lengths = [int(n) for n in args.lengths.split(",")]
    print(f"\nThe default {cached} cached requests, GiB:\n")
    print("| suffix_depth | " + " | ".join(f"{n}-token outputs" for n in lengths) + " |")
    print("|---|" + "---|" * len(lengths))
    for depth, b in per_token.items():
        print(f"| {depth} | " + " | ".join(f"{cached * n * b / 2**30:.1f}" for n in lengths) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
