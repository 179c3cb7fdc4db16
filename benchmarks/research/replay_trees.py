"""Lookahead's drafting replayed on known greedy outputs, without the model: tokens per step in seconds, not minutes.

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/research/replay_trees.py --generate  # once
    python benchmarks/research/replay_trees.py                                    # default settings
    python benchmarks/research/replay_trees.py --lookahead-config '{"lookup_len": 16}' --spec-factor 1

Greedy decoding is deterministic, so once plain decoding's outputs are known (`--generate`: float32 unless `--dtype`,
greedy, 128 tokens, the first `--num-prompts` prompts of HumanEval and chat-templated ShareGPT plus one more of each as
the warm-up, saved to `--sequences`), a lookahead run on them can be replayed exactly without the model: each step
builds the request's tree with the engine's own state, acceptance statistics and sizing (`plan_step`, under a fixed step
cost: `--fixed` seconds plus `--per-token` per request and per draft token, about what the engine fits at batch 1 on
this machine in float32), verifies it against the known continuation and updates the state as the engine would. A node's
argmax is known only on the true path (elsewhere the Jacobi window learns nothing), so the window's own part is
underrated; prompt lookup, the pool and the suffix trees (a global cache over the replayed requests, in order) replay as
they run. Prints, per dataset, tokens per step, draft nodes per step and the tokens per modelled second. For comparing
drafting and scoring changes; the engine benchmarks (`bench_methods.py`) have the last word.

`--concurrency R` replays R requests in flight as a closed-loop client keeps them (`vllm bench serve
--max-concurrency R`): each step sizes the requests' trees together through the engine's own `Drafting.plan`, with
the glue's resting rule, each request's room up to its `max_tokens` and no drafts in a step that admits a prompt
(the scheduler patch's rule), and vLLM's suffix method is replayed in the same schedule. A step of R requests and D
draft tokens costs `--fixed` + `--per-token` (R + D), a prompt's tokens priced as draft tokens:

    python benchmarks/research/replay_trees.py --concurrency 4 --fixed 0.0206 --per-token 0.00081 \
        --plugin-seconds 0.0002                                   # the fit of a 4-request float32 engine

`--calibration` adds, per dataset, how well the node scores the sizing reads predict acceptance: every node of every
step's tree whose position the output reaches, by score, the carried ones (those the sizing took) apart from the
drafted ones it left out, with their mean score and the share the sequence went through. Where the two columns
agree, the sizing weighs the right odds (window slots excepted: their worth lies in the n-grams they find, which the
replay cannot see).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_lookahead.devtools.sizing_replay import verify_known

RESULTS = Path(__file__).resolve().parents[1] / "results"
DATASETS = ("humaneval", "sharegpt")


def sizing_line(text: str) -> tuple[float, float]:
    """--sizing-line's FIXED,PER_TOKEN: seconds, FIXED > 0 and PER_TOKEN >= 0."""
    try:
        fixed, per_token = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FIXED,PER_TOKEN (two numbers of seconds), got {text!r}") from None
    if not fixed > 0 or not per_token >= 0:
        raise argparse.ArgumentTypeError(f"FIXED must be > 0 and PER_TOKEN >= 0, got {text!r}")
    return fixed, per_token


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generate", action="store_true", help="run plain decoding once and save its outputs")
    p.add_argument("--num-prompts", type=int, default=20, help="prompts per dataset (with --generate)")
    p.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="the model's dtype (with --generate)"
    )
    p.add_argument("--sequences", type=Path, default=RESULTS / "replay_sequences.json")
    p.add_argument("--lookahead-config", default=None, help="JSON of lookahead keys")
    p.add_argument("--spec-factor", type=float, default=None, help="vllm_lookahead.core.suffix.SPEC_FACTOR for the run")
    p.add_argument("--fixed", type=float, default=0.035, help="seconds of a one-request step without drafts")
    p.add_argument("--per-token", type=float, default=0.001, help="seconds per request and per draft token")
    p.add_argument(
        "--knee",
        type=int,
        default=1,
        help="tokens a step computes up to which a token costs --per-token-below instead (1: a straight line)",
    )
    p.add_argument("--per-token-below", type=float, default=None, help="seconds per token up to the knee")
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="requests in flight, as a closed-loop client keeps them (`replay_batch`): the trees of a step are sized "
        "together and a step of R requests and D drafts costs --fixed + --per-token (R + D)",
    )
    p.add_argument("--calibration", action="store_true", help="also print the node scores against acceptance")
    p.add_argument(
        "--oracle",
        action="store_true",
        help="carry exactly the drafted nodes each step's output goes through (a scorer that knew the output): the "
        "candidates' ceiling at this cost, against the sized trees",
    )
    p.add_argument(
        "--plugin-seconds",
        type=float,
        default=0.0,
        help="seconds a lookahead step adds for the plugin's own Python per request it decodes (drafting, "
        "verification; about 0.0022 at batch 1 on a CPU: `profile_engine.py --wall`), on lookahead's side of the "
        "ratio to suffix only",
    )
    p.add_argument(
        "--suffix-seed",
        type=int,
        default=0,
        metavar="N",
        help="first hold in the global suffix tree ChatGPT's first answers of N ShareGPT conversations apart from "
        "every benchmark prompt (prompts.sharegpt_answers), as a corpus a server might load",
    )
    p.add_argument(
        "--sizing-line",
        default=None,
        type=sizing_line,
        metavar="FIXED,PER_TOKEN",
        help="size the trees by this straight line instead, while the steps cost what the options above say",
    )
    args = p.parse_args(argv)
    if args.num_prompts < 1:
        p.error("--num-prompts must be >= 1")
    if not args.fixed > 0 or not args.per_token >= 0:
        p.error("--fixed must be > 0 and --per-token >= 0 (seconds)")
    if args.oracle and args.calibration:
        p.error("--calibration reads the scores the sizing weighs, which --oracle does not use")
    if not args.plugin_seconds >= 0:
        p.error("--plugin-seconds must be >= 0 (seconds)")
    if args.suffix_seed < 0:
        p.error("--suffix-seed must be >= 0 (conversations)")
    if args.concurrency < 1:
        p.error("--concurrency must be >= 1")
    if args.concurrency > 1 and (args.oracle or args.calibration):
        p.error("--oracle and --calibration replay one request at a time (--concurrency 1)")
    if args.knee < 1:
        p.error("--knee must be >= 1 (1: a straight line)")
    if args.per_token_below is not None and not 0 <= args.per_token_below <= args.per_token:
        p.error("--per-token-below must lie in [0, --per-token] (a token below the knee costs no more than past it)")
    return args


def generate(path: Path, num_prompts: int, dtype: str = "float32") -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    from vllm_lookahead.devtools.models import default_model_path
    from vllm_lookahead.devtools.prompts import as_chat, humaneval_prompts, sharegpt_prompts

    llm = LLM(model=default_model_path(), dtype=dtype, max_model_len=2048, seed=0, enforce_eager=True)
    from vllm_lookahead.core.recycle import TOP_K

    # the top tokens at every output position too: what token recycling learns at the rows a step went through
    sp = SamplingParams(temperature=0.0, max_tokens=128, logprobs=TOP_K)
    out = {}
    for ds in DATASETS:
        if ds == "humaneval":
            prompts = humaneval_prompts(num_prompts + 1)
        else:
            prompts = [as_chat(llm.get_tokenizer(), t) for t in sharegpt_prompts(num_prompts + 1)]
        outs = llm.generate(prompts, sp, use_tqdm=True)
        out[ds] = [
            (
                list(o.prompt_token_ids),
                list(o.outputs[0].token_ids),
                [[t for t, _ in sorted(lp.items(), key=lambda kv: kv[1].rank)][:TOP_K] for lp in o.outputs[0].logprobs],
            )
            for o in outs
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    print(f"saved {path}")


def cost_model(fixed: float, per_token: float, knee: int = 1, below: float | None = None) -> Any:
    """A fixed step cost (`cost.StepCost.fixed`): `fixed` plus `per_token` per token the step computes (requests and
    drafts), `below` each up to `knee` tokens."""
    from vllm_lookahead.core.cost import StepCost

    below = per_token if below is None else below
    knee = max(int(knee), 1)

    def seconds(t: int) -> float:
        return fixed + below * min(t, knee) + per_token * max(0, t - knee)

    points = sorted({1, knee, knee + 1, 1 << 16})
    return StepCost.fixed(points, [seconds(t) for t in points], max_tokens=1 << 16)


def replay(
    requests: Sequence[Sequence[Sequence]],
    params: object,
    model: Any,
    warm: int = 0,
    truth: Any = None,
    calibration: list[tuple[float, bool, bool]] | None = None,
    seed: Sequence[Sequence[int]] = (),
    oracle: bool = False,
) -> tuple[float, float, float]:
    """(tokens per step, draft nodes per step, tokens per modelled second) over requests[warm:], each request's
    (prompt, greedy output[, the target's top tokens at each output position]) replayed in order through one
    engine's shared statistics, suffix cache and token-recycling table (which learns only where the top tokens are
    given). Raises if a replayed output differs from the known one (the replay must be exact). `calibration`, when
    given, receives (score, carried, accepted) for each node of each counted step's tree that lies within the output:
    carried if the step verified it, accepted if the output goes through it. `seed`: token sequences the global suffix
    tree holds as finished outputs before the first request. `oracle`: each step carries exactly the drafted nodes the
    output goes through, as a scorer that knew the output would size it: the most the candidates can give at this
    cost (the sizing is then not used; the tree is still the state's, cut to `max_tree_nodes` by score, and the
    statistics still learn, for the sources that read them)."""
    from vllm_lookahead.core.acceptance import AcceptanceStats
    from vllm_lookahead.core.recycle import TokenRecycler
    from vllm_lookahead.core.sizing import plan_step, score_floor
    from vllm_lookahead.core.state import LookaheadState
    from vllm_lookahead.core.suffix import SuffixCandidates

    stats = AcceptanceStats()
    cost = model
    paid = cost if truth is None else truth
    suffix = (
        SuffixCandidates.create(params.suffix_depth, params.suffix_cache_requests) if params.suffix_candidates else None
    )
    if suffix is not None:
        suffix.seed(seed)
    recycle = TokenRecycler() if params.recycle_candidates else None
    steps = tokens = drafts = 0
    seconds = 0.0
    for rid, (prompt, output, *rest) in enumerate(requests):
        tops = rest[0] if rest else None  # tops[j]: at the row that produced output[j]
        state = LookaheadState(params, list(prompt), stats=stats, suffix=suffix, req_id=rid, recycle=recycle)
        made = [output[0]]  # the prefill's token
        while len(made) < len(output):
            truth = output[len(made) :]
            if oracle:
                whole = state.build_tree(made[-1])
                through, _ = whole.follow(truth)
                # The drafts on the output's path and no others (where the path reaches the output's end, its last
                # token is the target's own).
                carried = min(max(whole.depths[u] for u in through), len(truth) - 1)
                # Window slots off the path were not carried: they keep their guesses, as cut-off slots do.
                kept = {slot: u for slot, u in whole.window_node.items() if u in through and whole.depths[u] <= carried}
                trees, sizes = [dataclasses.replace(whole, window_node=kept)], [whole.num_nodes]
            else:
                tree = state.build_tree(made[-1], min_score=score_floor(cost, 1))
                trees, sizes = plan_step([tree], [1 << 16], 1, cost, 1 << 16)
                carried = sizes[0] - 1
            if calibration is not None and rid >= warm and not oracle:
                whole = trees[0]
                through, _ = whole.follow(truth)
                calibration.extend(
                    (whole.scores[u], u < sizes[0], u in through)
                    for u in range(1, whole.num_nodes)
                    if whole.depths[u] <= len(truth)
                )
            tree = trees[0].truncate(sizes[0])
            argmax, _, new = verify_known(tree, truth)
            top = None if tops is None else tops[len(made) : len(made) + len(new)]
            state.update(tree, argmax, new, top)
            made.extend(new)
            if rid >= warm:
                steps += 1
                tokens += len(new)
                drafts += carried
                seconds += paid.seconds(1, carried)
        state.close()
        if made != list(output):
            raise AssertionError(f"replay of request {rid} differs from its output")
    return tokens / max(steps, 1), drafts / max(steps, 1), tokens / max(seconds, 1e-9)


def vllm_suffix_defaults() -> dict[str, float]:
    """vLLM's own defaults of its suffix method (`SpeculativeConfig.suffix_decoding_*`), read from the installed
    vLLM rather than copied."""
    from vllm.config import SpeculativeConfig

    prefix = "suffix_decoding_"
    return {
        f.name[len(prefix) :]: f.default for f in dataclasses.fields(SpeculativeConfig) if f.name.startswith(prefix)
    }


def suffix_chain(cache: object, defaults: dict[str, float], rid: int, seq: Sequence[int], tokens: int) -> list[int]:
    """What vLLM's `SuffixDecodingProposer` drafts after `seq` (the request's prompt and output so far) with its
    default settings (`vllm_suffix_defaults`) and `tokens` speculative tokens."""
    import numpy as np

    depth = int(defaults["max_tree_depth"])
    draft = cache.speculate(
        rid,
        np.asarray(seq[-depth:], dtype=np.int32),
        max_spec_tokens=tokens,
        max_spec_factor=defaults["max_spec_factor"],
        min_token_prob=defaults["min_token_prob"],
    )
    return [int(t) for t in draft.token_ids]


def verify_chain(chain: Sequence[int], known: Sequence[int]) -> list[int]:
    """A chain verified against the output's known continuation: the accepted drafts and the target's own next
    token (cut where the output ends)."""
    k = 0
    while k < len(chain) and k < len(known) and chain[k] == known[k]:
        k += 1
    return list(known[: k + 1])


def replay_suffix(
    requests: Sequence[Sequence[Sequence]],
    model: Any,
    warm: int = 0,
    num_speculative_tokens: int = 8,
    chains: list[list[int]] | None = None,
) -> tuple[float, float, float]:
    """The same as `replay` for vLLM's own suffix method (`SuffixDecodingProposer`, with vLLM's defaults and the
    benchmarks' 8 speculative tokens): each step one chain from the suffix library, verified against the known
    output, priced by the same step cost (a step of R requests and D drafts: `model`'s seconds). The peer's side of a
    lookahead / suffix ratio in modelled seconds, free of the machine's drift between runs. `chains`, when given,
    receives every step's drafted chain."""
    import numpy as np
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    d = vllm_suffix_defaults()
    max_depth = int(d["max_tree_depth"])
    cost = model
    cache = SuffixDecodingCache(max_tree_depth=max_depth, max_cached_requests=int(d["max_cached_requests"]))
    steps = tokens = drafts = 0
    seconds = 0.0
    for rid, (prompt, output, *_) in enumerate(requests):
        cache.start_request(rid, np.asarray(prompt, dtype=np.int32))
        seq = [*prompt, output[0]]  # the prefill's token
        cache.add_active_response(rid, np.asarray(output[:1], dtype=np.int32))
        made = 1
        while made < len(output):
            chain = suffix_chain(cache, d, rid, seq, num_speculative_tokens)
            if chains is not None:
                chains.append(chain)
            new = verify_chain(chain, output[made:])
            cache.add_active_response(rid, np.asarray(new, dtype=np.int32))
            seq.extend(new)
            made += len(new)
            if rid >= warm:
                steps += 1
                tokens += len(new)
                drafts += len(chain)
                seconds += cost.seconds(1, len(chain))
        cache.stop_request(rid)
    return tokens / max(steps, 1), drafts / max(steps, 1), tokens / max(seconds, 1e-9)


@dataclasses.dataclass
class _Slot:
    """A request replayed in a batch: its recorded (prompt, output, tops), the tokens made so far, its state (lookahead)
    and what the last step proposed for it (lookahead: (tree, size); suffix: a chain)."""

    rid: int
    prompt: list[int]
    output: list[int]
    tops: list | None
    made: list[int]
    state: object = None
    proposed: object = None


def _closed_loop(requests: Sequence[Sequence[Sequence]], concurrency: int, warm: int):
    """A client that keeps `concurrency` requests in flight (requests[warm:], after the first `warm` alone), step by
    step: yields (the slots in flight, those of them admitted this step, whether the step counts). A request is
    admitted in the step after the one its predecessor finished in, its prompt computed there (its first token); the
    caller extends each other slot's `made` by what the step decoded, and finished slots leave before the next step."""
    for lo, hi, width, counted in ((0, warm, 1, False), (warm, len(requests), concurrency, True)):
        waiting = list(range(lo, hi))
        active: list[_Slot] = []
        while waiting or active:
            admitted = []
            while waiting and len(active) + len(admitted) < width:
                rid = waiting.pop(0)
                prompt, output, *rest = requests[rid]
                admitted.append(_Slot(rid, list(prompt), list(output), rest[0] if rest else None, [output[0]]))
            yield active, admitted, counted
            active[:] = [s for s in active if len(s.made) < len(s.output)] + admitted


def replay_batch(
    requests: Sequence[Sequence[Sequence]],
    params: object,
    model: Any,
    concurrency: int,
    warm: int = 0,
    truth: Any = None,
    max_tokens: int = 128,
    plugin_seconds: float = 0.0,
    method: str = "lookahead",
    seed: Sequence[Sequence[int]] = (),
    num_speculative_tokens: int = 8,
) -> tuple[float, float, float]:
    """(tokens per request-step, draft tokens per request-step, tokens per modelled second) of `concurrency`
    requests in flight, as a closed-loop client keeps them (`vllm bench serve --max-concurrency`): requests[warm:]
    after the first `warm` alone. Lookahead drafts through the engine's own `Drafting.plan` (the fitted cost frozen
    at `model`, the glue's resting rule and each request's room up to `max_tokens`), and a step that admits a prompt
    carries no drafts while the admitted are at least a quarter of the running requests (the scheduler patch's
    rule); `method="suffix"` replays vLLM's suffix method instead (each request's chain from the library with vLLM's
    defaults and `num_speculative_tokens`, the benchmarks' 8, drafted every step). A step of R decoding requests, D
    draft tokens and P prompt tokens costs `truth`'s seconds(R, D + P) (prompt tokens priced as draft tokens), plus
    `plugin_seconds` per lookahead request that decodes. `seed`: as `replay`'s (lookahead only: vLLM's suffix method
    loads no corpus)."""
    import numpy as np

    from vllm_lookahead.core.acceptance import AcceptanceStats
    from vllm_lookahead.core.recycle import TokenRecycler
    from vllm_lookahead.core.state import LookaheadState
    from vllm_lookahead.core.suffix import SuffixCandidates
    from vllm_lookahead.glue.drafting import Drafting
    from vllm_lookahead.glue.patches.scheduler import ADMISSION_SHARE
    from vllm_lookahead.glue.recycling import RecyclingGate
    from vllm_lookahead.glue.resting import Rests

    lookahead = method == "lookahead"
    paid = model if truth is None else truth
    if lookahead:
        stats = AcceptanceStats()
        suffix = (
            SuffixCandidates.create(params.suffix_depth, params.suffix_cache_requests)
            if params.suffix_candidates
            else None
        )
        if suffix is not None:
            suffix.seed(seed)
        recycle = TokenRecycler() if params.recycle_candidates else None
        backend = type("Trees", (), {"trees": True})()
        drafting = Drafting(params, 1 << 30, 1, backend, RecyclingGate(recycle))
        drafting.cost = model
        rests = Rests()
    else:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        d = vllm_suffix_defaults()
        cache = SuffixDecodingCache(
            max_tree_depth=int(d["max_tree_depth"]), max_cached_requests=int(d["max_cached_requests"])
        )
    request_steps = tokens = drafts = first = 0
    seconds = 0.0
    for active, admitted, counted in _closed_loop(requests, concurrency, warm):
        # 1. the running requests' scheduled drafts, verified against their known outputs
        drop = lookahead and admitted and len(admitted) * ADMISSION_SHARE >= len(active)
        step_drafts, branched, made = 0, False, 0
        for s in active:
            known = s.output[len(s.made) :]
            if lookahead:
                tree, size = s.proposed or (None, 1)
                size = 1 if drop or tree is None else size
                if size > 1:
                    tree = tree.truncate(size)
                    argmax, accepted, new = verify_known(tree, known)
                    top = None if s.tops is None else s.tops[len(s.made) : len(s.made) + len(new)]
                    s.state.update(tree, argmax, new, top)
                    s.state.stats.observe_window(tree, accepted)
                    s.state.stats.observe_carried(tree, accepted)
                    step_drafts += size - 1
                    branched = branched or not tree.is_chain
                else:
                    new = known[:1]
            else:
                chain = s.proposed or []
                new = verify_chain(chain, known)
                cache.add_active_response(s.rid, np.asarray(new, dtype=np.int32))
                step_drafts += len(chain)
            s.made.extend(new)
            made += len(new)
        # 2. the admitted prompts, computed in the same step: each request's first token
        for s in admitted:
            if lookahead:
                s.state = LookaheadState(params, s.prompt, stats=stats, suffix=suffix, req_id=s.rid, recycle=recycle)
            else:
                cache.start_request(s.rid, np.asarray(s.prompt, dtype=np.int32))
                cache.add_active_response(s.rid, np.asarray(s.made, dtype=np.int32))
        prompt_tokens = sum(len(s.prompt) for s in admitted)
        decoding = len(active)
        if counted:
            request_steps += decoding
            tokens += made
            first += len(admitted)
            drafts += step_drafts
            seconds += paid.seconds(max(decoding, 1), step_drafts + prompt_tokens, branched)
            seconds += plugin_seconds * decoding if lookahead else 0.0
        # 3. the finished requests leave; the others' next drafts
        for s in active:
            if len(s.made) >= len(s.output):
                if lookahead:
                    s.state.catch_up(len(s.prompt) + len(s.made), _fetch(s))
                    s.state.close()
                else:
                    cache.stop_request(s.rid)
                if s.made != s.output:
                    raise AssertionError(f"replay of request {s.rid} differs from its output")
        running = [s for s in active if len(s.made) < len(s.output)] + admitted
        if lookahead:
            ready, caps, rows = [], [], []
            for s in running:
                s.proposed = None
                n = len(s.prompt) + len(s.made)
                room = len(s.prompt) + max_tokens - n - 1
                if room <= 0 or rests.resting(s.rid):
                    continue
                s.state.catch_up(n, _fetch(s))
                ready.append((s.state, s.made[-1]))
                caps.append(room + 1)
                rows.append(s)
            budget = params.step_token_budget - len(ready)
            if ready and budget > 0:
                trees, sizes = drafting.plan(ready, caps, len(running), budget)
                for s, tree, size in zip(rows, trees, sizes, strict=True):
                    s.proposed = (tree, size)
                    rests.built(s.rid, carried=size > 1)
        else:
            for s in running:
                s.proposed = suffix_chain(cache, d, s.rid, [*s.prompt, *s.made], num_speculative_tokens)
    # tokens per request-step, the prompts' first tokens left out
    return tokens / max(request_steps, 1), drafts / max(request_steps, 1), (tokens + first) / max(seconds, 1e-9)


def _fetch(s: _Slot):
    seq = [*s.prompt, *s.made]
    return lambda a, b: seq[a:b]


def with_plugin_seconds(per_step: float, rate: float, plugin_seconds: float) -> float:
    """Tokens per modelled second when each step also pays `plugin_seconds` (per_step / rate: a step's mean time)."""
    return rate if not plugin_seconds else per_step / (per_step / rate + plugin_seconds)


SCORE_EDGES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)


def calibration_table(records: Sequence[tuple[float, bool, bool]]) -> list[str]:
    """Markdown rows of `replay`'s calibration records by score (SCORE_EDGES): carried and left-out nodes, each with
    their count, mean score and the share accepted."""
    rows = [
        "| score | carried nodes | their mean score | accepted | left-out nodes | their mean score | accepted |",
        "|---|---|---|---|---|---|---|",
    ]
    for lo, hi in zip(SCORE_EDGES, (*SCORE_EDGES[1:], float("inf")), strict=True):
        cells = []
        for carried in (True, False):
            sel = [(s, a) for s, c, a in records if c == carried and lo <= s < hi]
            n = len(sel)
            cells += [
                str(n),
                *(["-", "-"] if not n else [f"{sum(s for s, _ in sel) / n:.3f}", f"{sum(a for _, a in sel) / n:.3f}"]),
            ]
        if cells[0] != "0" or cells[3] != "0":
            label = f"{lo:.2f}+" if hi == float("inf") else f"{lo:.2f}-{hi:.2f}"
            rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.generate:
        generate(args.sequences, args.num_prompts, args.dtype)
        return 0
    if not args.sequences.exists():
        print(f"no {args.sequences}: run with --generate first", file=sys.stderr)
        return 2
    from vllm_lookahead.core import suffix
    from vllm_lookahead.core.params import LookaheadParams

    if args.spec_factor is not None:
        suffix.SPEC_FACTOR = args.spec_factor
    params = LookaheadParams.from_mapping(json.loads(args.lookahead_config or "{}"))
    data = json.loads(args.sequences.read_text())
    seed: list[list[int]] = []
    if args.suffix_seed:
        from transformers import AutoTokenizer

        from vllm_lookahead.devtools.models import default_model_path
        from vllm_lookahead.devtools.prompts import sharegpt_answers

        tokenizer = AutoTokenizer.from_pretrained(default_model_path())  # the model --generate ran
        seed = [tokenizer.encode(a, add_special_tokens=False) for a in sharegpt_answers(args.suffix_seed)]
        print(f"global suffix tree seeded with {len(seed)} answers, {sum(map(len, seed))} tokens")
    knee = "" if args.knee <= 1 else f" past {args.knee} tokens, {args.per_token_below} s up to them"
    if args.sizing_line is not None:
        knee += f"; trees sized by the line {args.sizing_line[0]} s + {args.sizing_line[1]} s per token"
    if args.oracle:
        knee += "; oracle: each step carries exactly the drafts the output goes through"
    print(f"settings: {args.lookahead_config or 'defaults'}, suffix spec factor {suffix.SPEC_FACTOR}, step cost "
          f"{args.fixed} s + {args.per_token} s per request and draft token{knee}\n")  # fmt: skip
    if args.concurrency > 1:
        print(f"{args.concurrency} requests in flight: tokens and draft nodes per request-step\n")
    print(
        "| dataset | requests | tokens per step | draft nodes per step | tokens per modelled second "
        "| suffix (vLLM's): tokens per step | draft nodes per step | tokens per modelled second | lookahead / suffix |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    records: dict[str, list[tuple[float, bool, bool]]] = {}
    for ds in DATASETS:
        requests = data[ds]
        # the last request is the warm-up, replayed first
        paid = cost_model(args.fixed, args.per_token, args.knee, args.per_token_below)
        model = paid if args.sizing_line is None else cost_model(*args.sizing_line)
        calibration = None
        if args.calibration:
            calibration = records[ds] = []
        ordered = [requests[-1], *requests[:-1]]
        if args.concurrency > 1:
            tf, nodes, rate = replay_batch(
                ordered, params, model, args.concurrency, warm=1, truth=paid, plugin_seconds=args.plugin_seconds,
                seed=seed,
            )  # fmt: skip
            peer = replay_batch(ordered, params, paid, args.concurrency, warm=1, method="suffix")
        else:
            tf, nodes, rate = replay(
                ordered, params, model, warm=1, truth=paid, calibration=calibration, seed=seed, oracle=args.oracle
            )
            rate = with_plugin_seconds(tf, rate, args.plugin_seconds)  # on lookahead's side only
            peer = replay_suffix(ordered, paid, warm=1)
        print(
            f"| {ds} | {len(requests) - 1} | {tf:.2f} | {nodes:.1f} | {rate:.1f} "
            f"| {peer[0]:.2f} | {peer[1]:.1f} | {peer[2]:.1f} | {rate / peer[2]:.3f}x |"
        )
    for ds, rec in records.items():
        print(f"\n{ds}: node scores against acceptance\n")
        print("\n".join(calibration_table(rec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
