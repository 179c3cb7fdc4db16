"""How often prompt lookup's first guessed token is right, by what the candidate knows of itself: how much context its
occurrence matches, and whether the key's other occurrences agree. No model: plain decoding's greedy outputs.

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/replay_trees.py --generate --num-prompts 60 \
        --sequences benchmarks/results/replay_sequences_60.json    # once: the outputs
    python benchmarks/lookup_calibration.py --sequences benchmarks/results/replay_sequences_60.json

At every output position of every request (the prompt and the output so far indexed, as a request's own
`LookupIndex` holds them), the index's first candidate (`lookup_candidates` 1, the default) is compared with the
token that came next. The rows say what `lookup.py`'s sources and estimates rest on: the share of first tokens that
were right, by the occurrence's matched context (1, 2, 3, 4-7, 8-15, 16+ tokens: `MATCH_CAP`) and by its first
token's estimate (the share of the key's occurrences that agree with it: all, or not all), and by whether the suffix
trees' speculation at the same position offers that token too (offers it, offers other first tokens, offers none).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
BUCKETS = ((1, 1), (2, 2), (3, 3), (4, 7), (8, 15), (16, 16))
SUFFIX_ROWS = ("offers it", "offers others", "offers none")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sequences", type=Path, default=RESULTS / "replay_sequences.json")
    p.add_argument("--lookup-len", type=int, default=8, help="tokens per candidate")
    return p.parse_args(argv)


def bucket(matched: int) -> str:
    for lo, hi in BUCKETS:
        if lo <= matched <= hi:
            return str(lo) if lo == hi else f"{lo}-{hi}"
    raise ValueError(f"matched context out of range: {matched}")


def calibrate(
    requests: Sequence[Sequence[Sequence[int]]], length: int = 8, with_suffix: bool = True
) -> dict[tuple[str, str], list[int]]:
    """(("matched", bucket), ("agree", "all"/"not all") or ("suffix", SUFFIX_ROWS)) -> [candidates, first tokens
    right]. The suffix rows (when `with_suffix` and arctic_inference is installed): whether the suffix trees'
    speculation at the same position (the request's prompt and output, and the earlier requests' outputs, as the
    engine keeps them) offers the candidate's first token among its first tokens."""
    from vllm_lookahead.core.lookup import LookupIndex
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.core.suffix import SuffixCandidates

    params = LookaheadParams()
    suffix = SuffixCandidates.create(params.suffix_depth, params.suffix_cache_requests) if with_suffix else None
    out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for rid, (prompt, output, *_) in enumerate(requests):
        index = LookupIndex(list(prompt))
        if suffix is not None:
            suffix.start(rid, list(prompt))
        for t, tok in enumerate(output):
            cands = index.candidates(1, length) if t else []
            if cands:
                c = cands[0]
                right = int(c.tokens[0] == tok)
                keys = [("matched", bucket(c.matched)), ("agree", "all" if c.estimates[0] == 1.0 else "not all")]
                if suffix is not None:
                    spec = suffix.candidates(rid, index.tokens[-params.suffix_depth :], params.suffix_candidates)
                    firsts = {s.tokens[0] for s in spec}
                    keys.append(("suffix", SUFFIX_ROWS[0 if c.tokens[0] in firsts else 1 if firsts else 2]))
                for key in keys:
                    out[key][0] += 1
                    out[key][1] += right
            index.extend([tok])
            if suffix is not None:
                suffix.extend(rid, [tok])
        if suffix is not None:
            suffix.stop(rid)
    return dict(out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.sequences.exists():
        print(f"no {args.sequences}: run benchmarks/replay_trees.py --generate first", file=sys.stderr)
        return 2
    data = json.loads(args.sequences.read_text())
    print("| dataset | by | value | candidates | first token right |")
    print("|---|---|---|---|---|")
    for ds, requests in data.items():
        table = calibrate(requests, args.lookup_len)
        order = [("matched", bucket(lo)) for lo, _ in BUCKETS] + [("agree", "all"), ("agree", "not all")]
        order += [("suffix", row) for row in SUFFIX_ROWS]
        for key in order:
            if key in table:
                n, right = table[key]
                print(f"| {ds} | {key[0]} | {key[1]} | {n} | {right / n:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
