"""Speculative methods measured by vLLM's own clients: `vllm bench serve` against `vllm serve`, `vllm bench throughput`.

    python benchmarks/bench_serve.py                                   # float32, the full sweep (hours on 2 cores)
    python benchmarks/bench_serve.py --dtype bfloat16 --rounds 3       # medians over 3 interleaved rounds
    python benchmarks/bench_serve.py --methods none,lookahead --datasets random --concurrency 1 \\
        --num-prompts 2 --output-len 16 --no-offline                   # a smoke run (a few minutes)

For each round (`--rounds R`) and each method of `--methods` (default: plain decoding `none`, `ngram`, `suffix`,
`lookahead`; any method of `devtools.bench.METHODS`), the script starts one `vllm serve MODEL` on 127.0.0.1 (a free
port) under the project's CPU runtime
(`python -m vllm_lookahead.tools.cpu_runtime run -- vllm serve ...`) with the method's `--speculative-config`,
`--dtype`, a `--max-model-len` sized for the prompts, `--max-num-seqs` = the largest concurrency and
`--max-num-batched-tokens 2048` (one step budget for every engine and concurrency), waits for
`/health`, sends a few warm-up requests (an unrelated repetitive prompt), and then, for each dataset and each
concurrency of `--concurrency` (default 1,4,16,64), runs each method's client back to back, in an order rotated by one
a run (`--interleave`, the default: all of a round's servers are started first and each is stopped, SIGSTOP, while
another is measured, so that a run's ratios compare client runs seconds apart on a machine whose speed drifts over
minutes; `--no-interleave`: one server at a time runs all its datasets and concurrencies, in less memory):

    vllm bench serve --max-concurrency C --num-prompts min(--max-prompts, max(K C, --num-prompts)) --request-rate inf
        --temperature 0 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 --ready-check-timeout-sec 0
        --save-result --save-detailed ...

(`--ready-check-timeout-sec 0`: no untimed first request, which would generate the run's first prompt and let the
methods that learn from earlier outputs meet its answer again in the timed run.) K is `--per-slot` (default 4): with
one or two prompts a slot a run is mostly its first wave and the drain after it, where the requests a speculative
method sped up are gone and its slowest ones decode on in a shrinking batch (bfloat16 chat at 64: lookahead 0.98x
plain decoding's tokens/s with 64 prompts, 1.02x with 256).

Server start-up, compilation and warm-up are not timed; each client run is timed by vLLM's client itself. The server's
`/metrics` is scraped right before and after each client run, and a lookahead server's `lookahead_stats` too (it runs
with `VLLM_SERVER_DEV_MODE=1` for `/collective_rpc`): the run's steps and draft tokens and the step-cost fit after it.
With `--offline` (the default) each round then runs `vllm bench throughput` (its own engine, all prompts at once,
`--max-num-seqs` = the largest concurrency, as many prompts as the largest concurrency's serve run, `--num-warmups` =
`--warmup-requests`) per method and dataset; `--no-serve` runs only these. Its warm-up prompts are drawn by vLLM
from the same prompt file (random: from another seed), so on chat and code the methods that learn from earlier
outputs may have seen a few of the measured prompts once, sampled.

Datasets (`--datasets`, default random,chat,code):
- `random`: vLLM's own (`--random-input-len 128 --random-output-len 128` by default; vLLM ignores EOS for it). Each
  concurrency level gets its own seed, so the prompts differ between levels.
- `chat`: ShareGPT first human turns in the model's chat template (`vllm_lookahead.devtools.bench.set_prompts`);
  `code`: HumanEval prompts, raw (code completion). Both are written as ShareGPT-format JSON
  (`[{"conversations": [{"from": "human", "value": PROMPT}, {"from": "gpt", "value": ""}]}]`), the one file format
  both `vllm bench serve` and `vllm bench throughput` read (0.32's `throughput` has no `custom` dataset); the length
  comes from `--sharegpt-output-len` / `--output-len`. vLLM's ShareGPT loader sends the prompt text as it is (no chat
  template of its own), so chat prompts are templated exactly once. Each concurrency level gets its own slice of
  prompts (a server's prefix cache and the suffix caches of suffix / lookahead would otherwise have seen them);
  where a set has fewer prompts than the levels want (HumanEval's 164), the largest levels send fewer, down to one
  a slot, and only then do prompts wrap around (the run says which).

Greedy by default (`--temperature 0`, sent with each request). EOS ends chat and code requests unless `--ignore-eos`.
`vllm bench throughput` cannot be made greedy: vLLM 0.32 hard-codes temperature 1.0 and ignore_eos for it (so it
runs with `VLLM_LOOKAHEAD_FIX_CPU_SAMPLING=1`, as every engine here does, for vLLM's methods' CPU rejection sampler).

Reported per run kind (serve / offline), dataset, method and concurrency, as medians over the rounds with their
min-max spread: output tokens/s (vLLM's `output_throughput`; offline: output tokens / `elapsed_time`), the ratio to
plain decoding in the same round (the median of the per-round ratios), mean and p99 TTFT (and in the headline table
the mean TTFT of the requests sent after the first wave, which join a running batch, from the per-request times of
`--save-detailed`), mean and p99 ITL (vLLM's
client measures ITL between streamed chunks: a speculative step that returns k tokens is one interval; TPOT, per
token, is in the JSON), and tokens per forward = generated tokens / (generated tokens - accepted draft tokens), both
from the server's /metrics counters (`vllm:generation_tokens_total`, `vllm:spec_decode_num_accepted_tokens_total`)
before and after the run (1.0 for plain decoding; not available offline). Also in the JSON: vLLM's own
`spec_decode_acceptance_rate` / `_length` from the saved result.

Output (`--out`, default `benchmarks/results/serve/<dtype>/`, not tracked by git), named after the settings (TAG):
`TAG.md` (also printed: lookahead against the others per dataset and concurrency, its tokens/s over the best other
method's and its TTFT over plain decoding's, both taken within each round; then every run), `TAG.png` (output tokens/s
and mean TTFT against concurrency, one panel per dataset), `TAG.json` (settings, every run's record, the summary;
rewritten after each run), and `TAG/`: `logs/` (each server's and client's output), `raw/` (vLLM's saved result JSON
of each run, each server's last /metrics scrape) and `datasets/` (the prompt files). A server that fails to start is
reported with its log's tail and the sweep goes on with the other methods; servers are killed on every exit path
(Ctrl-C, SIGTERM, errors). `--report TAG.json` rewrites TAG.md and TAG.png from a saved run (one cut short included)
without rerunning it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from vllm_lookahead.devtools import bench
from vllm_lookahead.devtools import server as devserver
from vllm_lookahead.devtools.server import http_get, log_tail

HOST = devserver.HOST
# The methods every benchmark script compares (method -> speculative_config; what each needs installed), shared.
METHODS, REQUIRES = bench.METHODS, bench.REQUIRES
DATASETS = ("random", "chat", "code")
# Repetitive, so speculative methods draft and verify during warm-up; unrelated to the datasets, so methods that learn
# from earlier outputs (suffix, lookahead's suffix cache) gain nothing on the measured prompts.
WARMUP_PROMPT = "Repeat: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat,"
# vLLM's ShareGPT loader drops prompts outside these bounds (`is_valid_sequence`): the files hold none of them.
SHAREGPT_MIN_PROMPT, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048
# /metrics counters (Prometheus text; summed over label sets, e.g. engines)
GENERATION = "vllm:generation_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
COUNTERS = (GENERATION, ACCEPTED, DRAFTS, DRAFT_TOKENS)
# The summary's metrics: record key -> table header
METRICS = {
    "output_tps": "tok/s",
    "ttft_mean_ms": "TTFT mean",
    "ttft_p99_ms": "TTFT p99",
    "ttft_later_ms": "TTFT after the first wave",
    "itl_mean_ms": "ITL mean",
    "itl_p99_ms": "ITL p99",
    "tpot_mean_ms": "TPOT mean",
    "tokens_per_forward": "tok/fwd",
    "acceptance_rate": "accept %",
}


# ------------------------------------------------------------------------------------------------------- arguments


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _name_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default=bench.DEFAULT_METHODS, help=f"comma list from: {', '.join(METHODS)}")
    p.add_argument("--datasets", default=",".join(DATASETS), help=f"comma list from: {', '.join(DATASETS)}")
    p.add_argument("--concurrency", default="1,4,16,64", help="comma list of client concurrencies (--max-concurrency)")
    p.add_argument(
        "--prompts-as",
        default=None,
        help="comma list of concurrencies: give each run the prompts (and random seed) a sweep over these levels gives "
        "it, and the servers its --max-num-seqs, so that one cell of a sweep runs again on its own prompts "
        "(default: --concurrency)",
    )
    p.add_argument("--num-prompts", type=int, default=16, help="N: a run at concurrency C sends max(K C, N) prompts")
    p.add_argument("--per-slot", type=int, default=4, help="K: prompts per concurrent slot (see --num-prompts)")
    p.add_argument("--max-prompts", type=int, default=256, help="cap on a run's prompts")
    p.add_argument("--output-len", type=int, default=128, help="max new tokens per request (every dataset)")
    p.add_argument("--random-input-len", type=int, default=128, help="prompt tokens of the random dataset")
    p.add_argument("--ignore-eos", action="store_true", help="chat/code requests run to --output-len (random always)")
    p.add_argument("--temperature", type=float, default=0.0, help="the serve runs' temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=None, help="the serve runs' top-p (default: the server's)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--model", default=None, help="a model name of vllm_lookahead.devtools.models or a folder (default: SmolLM2)"
    )
    p.add_argument("--max-model-len", type=int, default=None, help="default: the longest prompt + output + margin")
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=2048,
        help="every engine's step token budget (vLLM's default depends on the entry point and on max_num_seqs x "
        "max_model_len: 256 for a server at concurrency 1 here, which would cut the speculative methods' drafts)",
    )
    p.add_argument("--eager", action="store_true", help="--enforce-eager (default: compiled, cached after a first run)")
    p.add_argument("--rounds", type=int, default=1, help="repeat the whole method sweep (medians over rounds)")
    p.add_argument(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="all methods' servers up at once, each run's methods back to back, idle servers stopped (SIGSTOP); "
        "--no-interleave: one server at a time, every run of a method in a row (less memory)",
    )
    p.add_argument(
        "--offline", action=argparse.BooleanOptionalAction, default=True, help="also `vllm bench throughput`"
    )
    p.add_argument(
        "--serve",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="`vllm bench serve` against `vllm serve`; --no-serve: the offline runs only",
    )
    p.add_argument("--warmup-requests", type=int, default=4, help="untimed requests after each server's start")
    p.add_argument("--kv-cache-gib", type=float, default=2.0, help="VLLM_CPU_KVCACHE_SPACE (unless already set)")
    p.add_argument(
        "--runtime", default="project", choices=["project", "vllm"], help="project: cpu_runtime; vllm: as is"
    )
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds for a server to answer /health")
    p.add_argument("--run-timeout", type=float, default=3600.0, help="seconds for one client or offline run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lookahead-config", default=None, help="JSON merged into every lookahead* speculative_config")
    p.add_argument("--out", default=None, help="results folder (default benchmarks/results/serve/<dtype>/)")
    p.add_argument("--report", metavar="TAG.json", default=None, help="rewrite TAG.md and TAG.png from a saved run")
    args = p.parse_args(argv)
    args.method_list = _name_list(args.methods)
    args.dataset_list = _name_list(args.datasets)
    try:
        args.concurrency_list = sorted(set(_int_list(args.concurrency)))
        args.level_list = sorted(set(_int_list(args.prompts_as))) if args.prompts_as else args.concurrency_list
    except ValueError:
        p.error("--concurrency and --prompts-as must be comma lists of integers")
    if not set(args.concurrency_list) <= set(args.level_list):
        p.error("--prompts-as must hold every --concurrency level")
    for m in args.method_list:
        if m not in METHODS:
            p.error(f"unknown method '{m}'; known: {', '.join(METHODS)}")
    for d in args.dataset_list:
        if d not in DATASETS:
            p.error(f"unknown dataset '{d}'; known: {', '.join(DATASETS)}")
    if not args.method_list or not args.dataset_list or not args.concurrency_list:
        p.error("--methods, --datasets and --concurrency must not be empty")
    if min(args.concurrency_list) < 1 or min(args.num_prompts, args.max_prompts, args.output_len, args.rounds) < 1:
        p.error("--concurrency, --num-prompts, --max-prompts, --output-len and --rounds must be positive")
    if args.per_slot < 1:
        p.error("--per-slot must be positive")
    if not args.serve and not args.offline:
        p.error("--no-serve and --no-offline leave nothing to run")
    bench.check_lookahead_config(p, args.lookahead_config)
    if args.out is None:
        args.out = str(Path("benchmarks") / "results" / "serve" / args.dtype)
    return args


def run_tag(args: argparse.Namespace) -> str:
    """The settings in a file name."""
    conc = "-".join(str(c) for c in args.concurrency_list)
    tag = f"{'-'.join(args.method_list)}_{'-'.join(args.dataset_list)}_c{conc}_n{args.num_prompts}"
    tag += f"-{args.max_prompts}k{args.per_slot}_t{args.output_len}_R{args.rounds}"
    return tag + ("_eager" if args.eager else "")


def speculative_config(method: str, args: argparse.Namespace) -> dict[str, Any] | None:
    return bench.speculative_config(method, args.lookahead_config)


def engine_flags(method: str) -> list[str]:
    """The method's engine options beyond the shared ones (`bench.engine_options`), as `vllm` command-line flags."""
    flags = []
    for key, value in bench.engine_options(method).items():
        name = key.replace("_", "-")
        flags.append(f"--{name}" if value is True else f"--no-{name}" if value is False else f"--{name}={value}")
    return flags


def num_prompts_for(concurrency: int, n: int, cap: int, per_slot: int) -> int:
    """A run's prompts: per_slot for each concurrent slot, at least n, at most cap. With one or two prompts a slot the
    run is mostly its first wave and the drain after it: plain decoding's requests of one length finish together,
    a speculative method's at different steps, and the last ones decode on in a shrinking batch, so the run measures
    its slowest requests more than tokens/s at that concurrency."""
    return min(cap, max(per_slot * concurrency, n))


def prompt_counts(
    concurrencies: Sequence[int], n: int, cap: int, per_slot: int, available: int | None = None
) -> dict[int, int]:
    """concurrency -> prompts of its run (`num_prompts_for`). Where a dataset's `available` distinct prompts are fewer
    than the levels want, the largest levels send fewer, down to one a slot, rather than repeat a prompt to a server
    that has seen its answer."""
    counts = {c: num_prompts_for(c, n, cap, per_slot) for c in concurrencies}
    excess = sum(counts.values()) - available if available is not None else 0
    for c in sorted(counts, reverse=True):
        cut = min(max(excess, 0), counts[c] - min(counts[c], c))
        counts[c] -= cut
        excess -= cut
    return counts


def prompt_slices(counts: dict[int, int]) -> dict[int, tuple[int, int]]:
    """concurrency -> (first prompt index, count): consecutive, disjoint slices in concurrency order."""
    slices, start = {}, 0
    for c, count in counts.items():
        slices[c] = (start, count)
        start += count
    return slices


# ------------------------------------------------------------------------------------------------------ datasets


def sharegpt_records(prompts: Iterable[str]) -> list[dict[str, Any]]:
    """Prompts in the ShareGPT format vLLM's loader reads (it keeps entries with at least two turns; the answer's
    length is only read when no output length is given, and one always is here)."""
    return [{"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": ""}]} for p in prompts]


def write_sharegpt_file(path: Path, prompts: Sequence[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sharegpt_records(prompts), ensure_ascii=False), encoding="utf-8")
    return path


def loadable(prompt_tokens: int, output_len: int) -> bool:
    """Whether vLLM's ShareGPT loader keeps a prompt of this length (vllm.benchmarks.datasets.is_valid_sequence with an
    output length given)."""
    return (
        SHAREGPT_MIN_PROMPT <= prompt_tokens <= SHAREGPT_MAX_PROMPT and prompt_tokens + output_len <= SHAREGPT_MAX_TOTAL
    )


def dataset_prompts(dataset: str, count: int, tokenizer: Any, output_len: int) -> tuple[list[str], list[int]]:
    """Up to `count` distinct prompts of a file dataset (chat: templated ShareGPT; code: raw HumanEval) that vLLM's
    loader keeps, with their token counts. HumanEval has fewer than a full sweep may need: the caller wraps around."""
    prompts: list[str] = []
    lengths: list[int] = []
    want = count
    while True:
        if dataset == "code":
            raw = bench.set_prompts("humaneval", min(want, bench.HUMANEVAL_SIZE), tokenizer)
        else:
            raw = bench.set_prompts("sharegpt", want, tokenizer)
        prompts, lengths = [], []
        for text in raw:
            n = len(tokenizer(text).input_ids)
            if loadable(n, output_len):
                prompts.append(text)
                lengths.append(n)
        # Some were too long for vLLM's loader: ask for more, unless the source has no more.
        if len(prompts) >= count or len(raw) < want or (dataset == "code" and want >= bench.HUMANEVAL_SIZE):
            return prompts[:count], lengths[:count]
        want += count - len(prompts)


def write_datasets(args: argparse.Namespace, tokenizer: Any, folder: Path) -> tuple[dict[str, Any], int, list[str]]:
    """The prompt files of the file datasets: (dataset -> {"serve": {concurrency: path}, "offline": path}), each
    dataset's prompts per concurrency (dataset -> {concurrency: count}, under "counts"), the longest prompt in tokens
    (random's included) and notes for the report (levels cut to the prompts there are, prompts reused)."""
    wanted = prompt_counts(args.level_list, args.num_prompts, args.max_prompts, args.per_slot)
    total = sum(wanted.values())
    offline_count = num_prompts_for(max(args.concurrency_list), args.num_prompts, args.max_prompts, args.per_slot)
    files: dict[str, Any] = {"counts": {}}
    notes: list[str] = []
    longest = args.random_input_len if "random" in args.dataset_list else 0
    for dataset in args.dataset_list:
        if dataset == "random":
            files["counts"][dataset] = {c: wanted[c] for c in args.concurrency_list}
            continue
        prompts, lengths = dataset_prompts(dataset, max(total, offline_count), tokenizer, args.output_len)
        if not prompts:
            raise RuntimeError(f"no {dataset} prompt fits vLLM's ShareGPT loader with --output-len {args.output_len}")
        counts = prompt_counts(
            args.level_list, args.num_prompts, args.max_prompts, args.per_slot, available=len(prompts)
        )
        slices = prompt_slices(counts)
        if counts != wanted:
            cut = ", ".join(f"{counts[c]} at {c}" for c in counts if counts[c] != wanted[c])
            notes.append(f"{dataset}: {len(prompts)} distinct prompts for {total} wanted: {cut} (concurrency)")
        if sum(counts.values()) > len(prompts):
            notes.append(
                f"{dataset}: {sum(counts.values())} prompts at one a slot, {len(prompts)} exist: "
                f"{sum(counts.values()) - len(prompts)} are reused (wrapped around) on the same server"
            )
        longest = max(longest, *lengths)
        counts = files["counts"][dataset] = {c: counts[c] for c in args.concurrency_list}
        serve = {}
        for c in counts:  # the levels this run runs, each with its slice of the sweep over --prompts-as
            start, count = slices[c]
            chosen = [prompts[(start + i) % len(prompts)] for i in range(count)]
            serve[c] = write_sharegpt_file(folder / f"{dataset}_c{c}.json", chosen)
        offline = [prompts[i % len(prompts)] for i in range(offline_count)]
        files[dataset] = {"serve": serve, "offline": write_sharegpt_file(folder / f"{dataset}_offline.json", offline)}
    return files, longest, notes


def max_model_len_for(longest_prompt: int, output_len: int) -> int:
    """Room for the longest prompt and its output, with a margin (the chat template, tokenizer differences), in whole
    blocks of 64."""
    need = longest_prompt + output_len + 64
    return -(-need // 64) * 64


# ------------------------------------------------------------------------------------------------ /metrics parsing


def parse_metrics(text: str) -> dict[str, Any]:
    """The counters in COUNTERS, summed over label sets, and the accepted tokens per draft position, from a /metrics
    scrape (Prometheus text format)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, Any] = {name: 0.0 for name in COUNTERS}
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
            elif sample.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total" and "position" in sample.labels:
                pos = int(sample.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
    totals["accepted_per_pos"] = per_pos
    return totals


def metrics_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What one run added to the counters."""
    delta: dict[str, Any] = {name: after[name] - before[name] for name in COUNTERS}
    positions = sorted(set(before["accepted_per_pos"]) | set(after["accepted_per_pos"]))
    delta["accepted_per_pos"] = [
        after["accepted_per_pos"].get(p, 0.0) - before["accepted_per_pos"].get(p, 0.0) for p in positions
    ]
    return delta


def tokens_per_forward(output_tokens: float, accepted_tokens: float) -> float | None:
    """Tokens a request gains per target forward: each forward yields one token of its own plus the drafts it
    accepted, so forwards = output - accepted. None without output."""
    forwards = output_tokens - accepted_tokens
    return output_tokens / forwards if output_tokens > 0 and forwards > 0 else None


# --------------------------------------------------------------------------------------------- result parsing


def parse_serve_result(result: dict[str, Any], delta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The numbers this benchmark reports from `vllm bench serve --save-result`'s JSON (and the run's /metrics
    counters, when scraped)."""
    row: dict[str, Any] = {
        "output_tps": result["output_throughput"],
        "duration_s": result["duration"],
        "completed": result["completed"],
        "failed": result.get("failed", 0),
        "output_tokens": result["total_output_tokens"],
        "input_tokens": result["total_input_tokens"],
        "request_throughput": result["request_throughput"],
    }
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "p50", "p99"):
            key = f"{stat}_{metric}_ms"
            if key in result:
                row[f"{metric}_{stat}_ms"] = result[key]
    row.update(ttft_by_wave(result))
    if "spec_decode_acceptance_rate" in result:
        row["acceptance_rate"] = result["spec_decode_acceptance_rate"]
        row["acceptance_length"] = result["spec_decode_acceptance_length"]
        row["client_accepted_tokens"] = result["spec_decode_accepted_tokens"]
        row["client_draft_tokens"] = result["spec_decode_draft_tokens"]
    if delta is not None:
        row["server_generated_tokens"] = delta[GENERATION]
        row["accepted_tokens"] = delta[ACCEPTED]
        row["draft_tokens"] = delta[DRAFT_TOKENS]
        row["drafts"] = delta[DRAFTS]
        row["accepted_per_pos"] = delta["accepted_per_pos"]
        row["tokens_per_forward"] = tokens_per_forward(delta[GENERATION], delta[ACCEPTED])
    return row


def ttft_by_wave(result: dict[str, Any]) -> dict[str, float]:
    """Mean TTFT of the first wave (the `max_concurrency` requests sent at once at the start, which queue for their
    prefills) and of the later requests (each sent as one finishes, into a running batch: it waits for the step in
    flight and its own admission step), from `--save-detailed`'s per-request `ttfts` and `start_times`."""
    ttfts, starts = result.get("ttfts"), result.get("start_times")
    if not ttfts or not starts or len(ttfts) != len(starts):
        return {}
    order = sorted(range(len(starts)), key=starts.__getitem__)
    wave = max(1, min(int(result.get("max_concurrency") or len(order)), len(order)))
    out = {"ttft_first_wave_ms": 1e3 * statistics.fmean(ttfts[i] for i in order[:wave])}
    if len(order) > wave:
        out["ttft_later_ms"] = 1e3 * statistics.fmean(ttfts[i] for i in order[wave:])
    return out


def parse_throughput_result(result: dict[str, Any], log_text: str, output_len: int) -> dict[str, Any]:
    """`vllm bench throughput --output-json`'s numbers. Its JSON has elapsed time, requests and prompt + output tokens
    but not the output tokens alone: taken from its printed `Total num output tokens:` (counted from the outputs),
    else requests x output length (it always sets ignore_eos, so every request runs to its length)."""
    output_tokens: float | None = None
    source = "requests x output length"
    for line in log_text.splitlines():
        if line.startswith("Total num output tokens:"):
            output_tokens, source = float(line.split(":", 1)[1]), "counted by vllm bench throughput"
    if output_tokens is None:
        output_tokens = float(result["num_requests"] * output_len)
    elapsed = result["elapsed_time"]
    return {
        "output_tps": output_tokens / elapsed,
        "duration_s": elapsed,
        "completed": result["num_requests"],
        "output_tokens": output_tokens,
        "output_tokens_source": source,
        "total_tps": result["tokens_per_second"],
        "request_throughput": result["requests_per_second"],
    }


# ------------------------------------------------------------------------------------------------------ summary


def spread(values: Sequence[float]) -> dict[str, float] | None:
    """Median and range of the rounds' values (None when no round has one)."""
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def summarize(records: Sequence[dict[str, Any]], methods: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (kind, dataset, method, concurrency): each metric's median over rounds with its spread, and the
    ratio to plain decoding (`none`) in the same round, dataset and concurrency, as the median of per-round ratios."""
    ok = [r for r in records if r.get("status") == "ok"]
    base = {
        (r["kind"], r["dataset"], r["concurrency"], r["round"]): r["output_tps"] for r in ok if r["method"] == "none"
    }
    keys: list[tuple[str, str, str, int]] = []
    for r in records:
        key = (r["kind"], r["dataset"], r["method"], r["concurrency"])
        if key not in keys:
            keys.append(key)
    order = {m: i for i, m in enumerate(methods)}
    kinds = {"serve": 0, "offline": 1}
    keys.sort(key=lambda k: (kinds.get(k[0], 9), k[1], k[3], order.get(k[2], len(order))))
    rows = []
    for kind, dataset, method, conc in keys:
        mine = [
            r for r in ok if (r["kind"], r["dataset"], r["method"], r["concurrency"]) == (kind, dataset, method, conc)
        ]
        failed = [
            r
            for r in records
            if (r["kind"], r["dataset"], r["method"], r["concurrency"]) == (kind, dataset, method, conc)
            and r.get("status") != "ok"
        ]
        row: dict[str, Any] = {
            "kind": kind,
            "dataset": dataset,
            "method": method,
            "concurrency": conc,
            "rounds": len(mine),
            "failed_rounds": len(failed),
        }
        if failed:
            row["errors"] = sorted({str(r.get("error", r.get("status")))[:200] for r in failed})
        for metric in METRICS:
            row[metric] = spread([r.get(metric) for r in mine])
        ratios = [
            r["output_tps"] / base[(kind, dataset, conc, r["round"])]
            for r in mine
            if base.get((kind, dataset, conc, r["round"]))
        ]
        row["ratio"] = spread(ratios)
        rows.append(row)
    return rows


def _fmt(stat: dict[str, float] | None, digits: int = 1, ranged: bool = True) -> str:
    if stat is None:
        return "-"
    text = f"{stat['median']:.{digits}f}"
    if ranged and stat["n"] > 1:
        text += f" ({stat['min']:.{digits}f}-{stat['max']:.{digits}f})"
    return text


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table: medians over rounds, (min-max) when there are several."""
    head = (
        "| run | dataset | method | conc | tok/s | vs none | TTFT mean / p99 ms | ITL mean / p99 ms | tok/fwd | rounds"
    )
    lines = [head + " |", "|" + "---|" * 10]
    for r in rows:
        ttft = f"{_fmt(r['ttft_mean_ms'], 0)} / {_fmt(r['ttft_p99_ms'], 0, False)}" if r["ttft_mean_ms"] else "-"
        itl = f"{_fmt(r['itl_mean_ms'], 1)} / {_fmt(r['itl_p99_ms'], 1, False)}" if r["itl_mean_ms"] else "-"
        rounds = str(r["rounds"]) + (f" ({r['failed_rounds']} failed)" if r["failed_rounds"] else "")
        cells = [
            r["kind"],
            r["dataset"],
            r["method"],
            str(r["concurrency"]),
            _fmt(r["output_tps"]),
            _fmt(r["ratio"], 2),
            ttft,
            itl,
            _fmt(r["tokens_per_forward"], 2),
            rounds,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def headline(records: Sequence[dict[str, Any]], methods: Sequence[str], target: str = "lookahead") -> str:
    """A markdown table of TARGET against the others, per dataset and concurrency of the serve runs: plain decoding's
    tokens/s, each method's tokens/s over plain decoding's (tokens per forward in brackets), TARGET over the best of
    the others (plain decoding included), TARGET's mean TTFT over plain decoding's, and the same for the requests
    sent after the first wave (`ttft_by_wave`). The ratios are taken within each round (runs minutes apart, not
    hours), then the median over rounds; the range follows when rounds differ."""
    ok = [r for r in records if r.get("status") == "ok" and r["kind"] == "serve"]
    by = {(r["dataset"], r["concurrency"], r["method"], r["round"]): r for r in ok}
    summary = {(r["dataset"], r["concurrency"], r["method"]): r for r in summarize(ok, methods)}
    others = [m for m in methods if m not in ("none", target)]
    cells = [m for m in methods if m != "none"]
    head = [
        "prompts", "concurrency", "plain tok/s", *cells, f"{target} / best other", "TTFT / plain",
        "TTFT after the first wave / plain",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    datasets = list(dict.fromkeys(r["dataset"] for r in ok))
    for dataset in datasets:
        for conc in sorted({r["concurrency"] for r in ok if r["dataset"] == dataset}):
            plain = summary.get((dataset, conc, "none"))
            if plain is None or (dataset, conc, target) not in summary:
                continue
            row = [dataset, str(conc), _fmt(plain["output_tps"], 0, False)]
            for m in cells:
                s = summary.get((dataset, conc, m))
                row.append("-" if s is None or s["ratio"] is None else
                           f"{s['ratio']['median']:.2f}x ({_fmt(s['tokens_per_forward'], 2, False)})")  # fmt: skip
            best, ttft, later = [], [], []
            for rnd in sorted({r["round"] for r in ok}):
                mine, base = by.get((dataset, conc, target, rnd)), by.get((dataset, conc, "none", rnd))
                rivals = [by.get((dataset, conc, m, rnd)) for m in ("none", *others)]
                if mine is None or base is None or any(r is None for r in rivals):
                    continue  # a round counts only where every method ran
                best.append(mine["output_tps"] / max(r["output_tps"] for r in rivals))  # type: ignore[union-attr]
                if mine.get("ttft_mean_ms") and base.get("ttft_mean_ms"):
                    ttft.append(mine["ttft_mean_ms"] / base["ttft_mean_ms"])
                if mine.get("ttft_later_ms") and base.get("ttft_later_ms"):
                    later.append(mine["ttft_later_ms"] / base["ttft_later_ms"])
            row += [_fmt(spread(best), 2), _fmt(spread(ttft), 2), _fmt(spread(later), 2)]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot(
    rows: Sequence[dict[str, Any]], datasets: Sequence[str], methods: Sequence[str], path: Path, title: str
) -> None:
    """Serve runs: output tokens/s, mean TTFT and (where saved) the mean TTFT of the requests after the first wave
    against concurrency; offline runs (`vllm bench throughput`): output
    tokens/s per method and concurrency as bars. One column per dataset; the error bars span the rounds' range. A
    panel row is drawn for each kind of run there is."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    if any(r["kind"] == "serve" for r in rows):
        panels += [("serve", "output_tps", "output tokens/s"), ("serve", "ttft_mean_ms", "mean TTFT (ms)")]
        if any(r["kind"] == "serve" and r.get("ttft_later_ms") for r in rows):
            panels.append(("serve", "ttft_later_ms", "TTFT after the first wave (ms)"))
    if any(r["kind"] == "offline" for r in rows):
        panels.append(("offline", "output_tps", "offline output tokens/s"))
    if not panels:
        raise ValueError("no runs to plot")
    fig, axes = plt.subplots(
        len(panels), len(datasets), figsize=(max(8, 5 * len(datasets)), 3.75 * len(panels)), squeeze=False
    )
    for col, dataset in enumerate(datasets):
        for line, (kind, metric, label) in enumerate(panels):
            ax = axes[line][col]
            mine = [r for r in rows if r["kind"] == kind and r["dataset"] == dataset and r[metric]]
            if kind == "serve":
                _plot_serve(ax, mine, methods, metric)
            else:
                _plot_offline(ax, mine, methods)
            ax.set_ylabel(label)
            if line == 0:
                ax.set_title(dataset)
            ax.grid(True, alpha=0.3)
            if col == 0 and ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _spread_err(pts: Sequence[dict[str, Any]], metric: str) -> tuple[list[float], list[list[float]]]:
    ys = [r[metric]["median"] for r in pts]
    return ys, [[y - r[metric]["min"] for y, r in zip(ys, pts, strict=True)],
                [r[metric]["max"] - y for y, r in zip(ys, pts, strict=True)]]  # fmt: skip


def _plot_serve(ax: Any, rows: Sequence[dict[str, Any]], methods: Sequence[str], metric: str) -> None:
    for method in methods:
        pts = [r for r in rows if r["method"] == method]
        if pts:
            ys, err = _spread_err(pts, metric)
            ax.errorbar([r["concurrency"] for r in pts], ys, yerr=err, marker="o", capsize=3, label=method)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")


def _plot_offline(ax: Any, rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> None:
    levels = sorted({r["concurrency"] for r in rows})
    width = 0.8 / max(len(methods), 1)
    for k, method in enumerate(methods):
        pts = sorted((r for r in rows if r["method"] == method), key=lambda r: r["concurrency"])
        if pts:
            ys, err = _spread_err(pts, "output_tps")
            xs = [levels.index(r["concurrency"]) + (k - (len(methods) - 1) / 2) * width for r in pts]
            ax.bar(xs, ys, width, yerr=err, capsize=3, label=method)
    ax.set_xticks(range(len(levels)), [f"max {c} at once" for c in levels])


# ------------------------------------------------------------------------------------------------------ processes


def available_memory() -> int:
    """Bytes that can be allocated without swapping (the kernel's MemAvailable)."""
    import psutil

    return psutil.virtual_memory().available


def tree_memory(pid: int) -> int:
    """Resident bytes of a process and its descendants (a server: its API server, engine core and workers)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


class OutOfMemory(RuntimeError):
    """Interleaving would start more servers than this machine's memory holds."""


def check_room_for_another(servers: Sequence[int], available: int) -> None:
    """Interleaving keeps every server resident: refuse to start one more when the memory left would not hold a
    server as large as the largest one up (with a quarter to spare for its runs), rather than let the kernel kill
    one mid-run or slow every run down (5 servers of 5 GiB on a 24 GiB machine did both)."""
    if not servers:
        return
    need = max(servers) * 5 // 4
    if available < need:
        gib = 1 << 30
        raise OutOfMemory(
            f"{len(servers)} servers are up, each up to {max(servers) / gib:.1f} GiB, and {available / gib:.1f} GiB "
            f"is left: not enough for one more ({need / gib:.1f} GiB). Run fewer --methods at a time, or "
            "--no-interleave (one server at a time)."
        )


def spawn(cmd: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    """CMD in its own process group (so it and its children are stopped together), output to log_path; it gets
    SIGTERM if this script dies."""
    return devserver.spawn(cmd, log_path=log_path, env=env, echo_command=True, die_with_parent=True)


def kill(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Stops CMD's process group: SIGTERM, SIGKILL after grace_s (`devtools.server.stop`)."""
    devserver.stop(proc, grace_s)


def vllm_command() -> list[str]:
    """The `vllm` command of this environment."""
    script = Path(sys.executable).parent / "vllm"
    return [str(script)] if script.exists() else [shutil.which("vllm") or "vllm"]


def runtime_prefix(args: argparse.Namespace) -> list[str]:
    """Engines run under the project's CPU runtime (TCMalloc + Intel OpenMP preloaded, threads bound to all cores on
    a small machine) unless --runtime vllm."""
    if args.runtime == "vllm":
        return []
    return [sys.executable, "-m", "vllm_lookahead.tools.cpu_runtime", "run", "--"]


def engine_env(args: argparse.Namespace, method: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{args.kv_cache_gib:g}")
    # The method's own variables; the CPU rejection-sampler fix on for every method, sampled or not (vLLM 0.32's reads
    # uninitialised temperatures for ngram / suffix drafts when sampling, and `vllm bench throughput` always samples;
    # a no-op for greedy requests).
    env.update(bench.method_environment(method, sampled=True))
    if method.startswith("lookahead"):
        env["VLLM_SERVER_DEV_MODE"] = "1"  # /collective_rpc: the plugin's counters and step-cost fit after each run
    return env


def http_post_json(url: str, body: dict[str, Any], timeout: float = 30.0) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode("utf-8", errors="replace"))


# lookahead_stats counters whose change over a run is recorded; the other values (the step-cost fit, acceptance
# factors) are recorded as they stand after it.
STATS_COUNTERS = (
    "steps",
    "tree_steps",
    "accepted",
    "timed_steps",
    "fallback_requests",
    "preemptions",
    "carried_score",
)


def lookahead_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """What one run did to a lookahead server's `lookahead_stats`: its counters' change (drafted_* / accepted_* by
    source included) and the fit and acceptance factors after it."""
    if not before or not after:
        return None
    out: dict[str, Any] = {}
    for key, value in after.items():
        if key in STATS_COUNTERS or key.startswith(("drafted_", "accepted_")):
            out[key] = value - before.get(key, 0)
        elif key.startswith(("step_cost_", "accept_")) or key in ("window_value", "calibration"):
            out[key] = value
    return out


class Server(devserver.Server):
    """One `vllm serve` for one method: started, checked healthy and warmed up on entry, stopped on exit (the
    lifecycle is `devtools.server.Server`'s)."""

    def __init__(self, method: str, args: argparse.Namespace, model: str, max_model_len: int, log_path: Path):
        super().__init__(
            log_path=log_path,
            env=engine_env(args, method),
            host=HOST,
            start_timeout_s=args.start_timeout,
            name=f"vllm serve ({method})",
            echo_command=True,
            die_with_parent=True,
        )
        self.method, self.args, self.model, self.max_model_len = method, args, model, max_model_len

    def command(self) -> list[str]:
        a = self.args
        cmd = [
            *runtime_prefix(a), *vllm_command(), "serve", self.model, "--host", HOST, "--port", str(self.port),
            "--dtype", a.dtype, "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(max(a.level_list)), "--max-num-batched-tokens", str(a.max_num_batched_tokens),
            "--seed", str(a.seed), "--disable-uvicorn-access-log",
        ]  # fmt: skip
        if a.eager:
            cmd.append("--enforce-eager")
        cmd += engine_flags(self.method)
        spec = speculative_config(self.method, a)
        if spec is not None:
            cmd += ["--speculative-config", json.dumps(spec)]
        return cmd

    def __enter__(self) -> Server:
        self.start()
        try:
            self._warm_up()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.resume()  # a stopped server answers no /metrics
            self.save_metrics()
            self.stop()

    def memory(self) -> int:
        return tree_memory(self.proc.pid) if self.proc is not None else 0

    def _complete(self, prompt: str, max_tokens: int) -> None:
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
        req = urllib.request.Request(
            f"{self.base}/v1/completions", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=600) as resp:
            resp.read()

    def _warm_up(self) -> None:
        """A few untimed concurrent requests: first-use costs (kernels, allocator, the plugin's step timing) off the
        clock."""
        errors: list[BaseException] = []

        def one() -> None:
            try:
                self._complete(WARMUP_PROMPT, 32)
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=one) for _ in range(self.args.warmup_requests)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(f"warm-up request failed on {self.method}: {errors[0]}; log {self.log_path}")

    def lookahead_stats(self) -> dict[str, Any] | None:
        """The worker's `lookahead_stats` (lookahead servers only, which run with VLLM_SERVER_DEV_MODE=1)."""
        if not self.method.startswith("lookahead"):
            return None
        try:
            results = http_post_json(f"{self.base}/collective_rpc", {"method": "lookahead_stats"})["results"]
        except (urllib.error.URLError, OSError, KeyError, json.JSONDecodeError):
            return None
        return next((r for r in results if r), None)

    def metrics(self) -> tuple[dict[str, Any], str]:
        status, text = http_get(f"{self.base}/metrics", timeout=30)
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        return parse_metrics(text), text

    def save_metrics(self) -> None:
        """The last scrape, kept beside the raw results (what the counters looked like)."""
        try:
            text = self.metrics()[1]
        except Exception:
            return
        path = self.log_path.parent.parent / "raw" / (self.log_path.stem.replace("server_", "metrics_") + ".txt")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def run_to_end(cmd: list[str], log_path: Path, env: dict[str, str], timeout: float) -> int:
    """Run CMD (its own process group, output to log_path) to its end; killed on timeout or on any exception."""
    proc = spawn(cmd, log_path, env)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with open(log_path, "a") as log:
            log.write(f"\n[bench_serve] killed after {timeout:.0f} s\n")
        return -9
    finally:
        kill(proc)


# ------------------------------------------------------------------------------------------------------ the runs


def serve_client_command(
    args: argparse.Namespace, port: int, model: str, dataset: str, concurrency: int, n: int, files: dict[str, Any]
) -> list[str]:
    cmd = [
        *vllm_command(), "bench", "serve", "--backend", "openai", "--host", HOST, "--port", str(port),
        "--model", model, "--num-prompts", str(n), "--max-concurrency", str(concurrency), "--request-rate", "inf",
        "--temperature", f"{args.temperature:g}", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99", "--disable-tqdm", "--save-detailed",
        # No readiness request: vLLM's client would first generate the run's first prompt in full, untimed, and the
        # methods that learn from earlier outputs (suffix, lookahead) would meet its answer again in the timed run
        # (one prompt in 8 at batch 1). The server was found healthy and warmed up before.
        "--ready-check-timeout-sec", "0",
    ]  # fmt: skip
    if args.top_p is not None:
        cmd += ["--top-p", f"{args.top_p:g}"]
    if dataset == "random":
        # A seed per concurrency level: different prompts at each level on the same server.
        seed = args.seed + args.level_list.index(concurrency)
        cmd += ["--dataset-name", "random", "--random-input-len", str(args.random_input_len)]
        cmd += ["--random-output-len", str(args.output_len), "--seed", str(seed)]
    else:
        cmd += ["--dataset-name", "sharegpt", "--dataset-path", str(files[dataset]["serve"][concurrency])]
        cmd += ["--sharegpt-output-len", str(args.output_len), "--disable-shuffle", "--no-oversample"]
        cmd += ["--seed", str(args.seed)]
        if args.ignore_eos:
            cmd.append("--ignore-eos")
    return cmd


def throughput_command(
    args: argparse.Namespace,
    method: str,
    model: str,
    dataset: str,
    max_model_len: int,
    files: dict[str, Any],
    out: Path,
) -> list[str]:
    n = num_prompts_for(max(args.concurrency_list), args.num_prompts, args.max_prompts, args.per_slot)
    cmd = [
        *runtime_prefix(args), *vllm_command(), "bench", "throughput", "--model", model, "--dtype", args.dtype,
        "--max-model-len", str(max_model_len), "--max-num-seqs", str(max(args.concurrency_list)),
        "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--seed", str(args.seed),
        "--num-prompts", str(n), "--num-warmups", str(args.warmup_requests), "--output-json", str(out),
    ]  # fmt: skip
    if args.eager:
        cmd.append("--enforce-eager")
    cmd += engine_flags(method)
    spec = speculative_config(method, args)
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    if dataset == "random":
        cmd += ["--dataset-name", "random", "--random-input-len", str(args.random_input_len)]
        cmd += ["--random-output-len", str(args.output_len)]
    else:
        cmd += ["--dataset-name", "sharegpt", "--dataset-path", str(files[dataset]["offline"])]
        cmd += ["--output-len", str(args.output_len)]
    return cmd


def progress(record: dict[str, Any], rounds: int, elapsed: float) -> str:
    head = (
        f"[round {record['round'] + 1}/{rounds}] {record['kind']:<7} {record['method']:<10} {record['dataset']:<6} "
        f"c={record['concurrency']:<3}"
    )
    if record["status"] != "ok":
        return f"{head} {record['status'].upper()}: {str(record.get('error', ''))[:300]} ({elapsed:.0f} s)"
    parts = [f"{record['output_tps']:7.1f} tok/s"]
    if record.get("ttft_mean_ms") is not None:
        parts.append(f"TTFT {record['ttft_mean_ms']:.0f} ms")
    if record.get("itl_mean_ms") is not None:
        parts.append(f"ITL {record['itl_mean_ms']:.1f} ms")
    if record.get("tokens_per_forward") is not None:
        parts.append(f"{record['tokens_per_forward']:.2f} tok/fwd")
    parts.append(f"{record['completed']} req")
    if (la := record.get("lookahead")) is not None:  # how much of the run drafted, and the step-cost fit after it
        drafted = sum(v for k, v in la.items() if k.startswith("drafted_"))
        parts.append(
            f"{drafted / max(la['steps'], 1):.1f} drafts/step, step {1e3 * la.get('step_cost_t1', 0):.1f} ms"
            f" at 1 token, {1e3 * la.get('step_cost_t8', 0):.1f} at 8"
        )
    return f"{head} {', '.join(parts)} ({elapsed:.0f} s)"


run_order = bench.run_order


class Sweep:
    """The state of one invocation: settings, where things go, the records so far (saved after each run)."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.tag = run_tag(args)
        self.out = Path(args.out)
        self.folder = self.out / self.tag
        self.logs, self.raw = self.folder / "logs", self.folder / "raw"
        self.records: list[dict[str, Any]] = []
        self.settings: dict[str, Any] = {}

    def add(self, record: dict[str, Any], elapsed: float) -> None:
        self.records.append(record)
        print(progress(record, self.args.rounds, elapsed), flush=True)
        self.save()

    def save(self) -> None:
        data = {
            "settings": self.settings,
            "records": self.records,
            "summary": summarize(self.records, self.args.method_list),
        }
        path = self.out / f"{self.tag}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
        tmp.replace(path)

    def start_server(self, rnd: int, method: str, model: str, max_model_len: int) -> Server | None:
        """The method's server, up and warmed (untimed); None if it failed, its runs recorded as such."""
        a = self.args
        log = self.logs / f"server_{method}_r{rnd}.log"
        t0 = time.monotonic()
        try:
            server = Server(method, a, model, max_model_len, log).__enter__()
        except RuntimeError as e:
            print(f"ERROR: {e}", file=sys.stderr, flush=True)
            base = {"kind": "serve", "round": rnd, "method": method, "spec_config": speculative_config(method, a)}
            for dataset in a.dataset_list:
                for c in a.concurrency_list:
                    record = {**base, "dataset": dataset, "concurrency": c, "status": "server-failed", "error": str(e)}
                    self.add(record, time.monotonic() - t0)
            return None
        print(f"[round {rnd + 1}/{a.rounds}] {method}: server up on port {server.port} "
              f"({time.monotonic() - t0:.0f} s, untimed)", flush=True)  # fmt: skip
        return server

    def serve_round(self, rnd: int, methods: Sequence[str], model: str, max_model_len: int, files: dict) -> None:
        """One round of serve runs. Interleaved (the default): every method's server is started first and stopped
        while idle; then each dataset and concurrency runs every method back to back, in an order rotated by one a
        run, so that a run's ratios compare client runs seconds apart (this shared machine's speed drifts by 10-20%
        over minutes). Otherwise one server at a time runs all its datasets and concurrencies."""
        a = self.args
        cells = [(d, c) for d in a.dataset_list for c in a.concurrency_list]
        if not a.interleave:
            for method in methods:
                server = self.start_server(rnd, method, model, max_model_len)
                if server is None:
                    continue
                try:
                    for dataset, c in cells:
                        self.serve_run(server, self._base(rnd, method, dataset, c), model, files)
                finally:
                    server.__exit__(None, None, None)
            return
        servers: dict[str, Server] = {}
        try:
            for method in methods:
                check_room_for_another([s.memory() for s in servers.values()], available_memory())
                server = self.start_server(rnd, method, model, max_model_len)
                if server is not None:
                    server.pause()
                    servers[method] = server
            for i, (dataset, c) in enumerate(cells):
                for method in run_order(list(servers), i):
                    server = servers[method]
                    server.resume()
                    try:
                        self.serve_run(server, self._base(rnd, method, dataset, c), model, files)
                    finally:
                        server.pause()
        finally:
            for server in servers.values():
                server.__exit__(None, None, None)

    def _base(self, rnd: int, method: str, dataset: str, c: int) -> dict[str, Any]:
        spec = speculative_config(method, self.args)
        return dict(kind="serve", round=rnd, method=method, spec_config=spec, dataset=dataset, concurrency=c)

    def serve_run(self, server: Server, base: dict[str, Any], model: str, files: dict[str, Any]) -> None:
        a = self.args
        dataset, c, rnd, method = base["dataset"], base["concurrency"], base["round"], base["method"]
        n = files["counts"][dataset][c]
        name = f"serve_{method}_{dataset}_c{c}_r{rnd}"
        result_path = self.raw / f"{name}.json"
        result_path.unlink(missing_ok=True)
        cmd = serve_client_command(a, server.port, model, dataset, c, n, files)
        cmd += [
            "--save-result",
            "--result-dir",
            str(self.raw),
            "--result-filename",
            result_path.name,
            "--label",
            method,
        ]
        t0 = time.monotonic()
        record: dict[str, Any] = {**base, "num_prompts": n}
        try:
            before, stats_before = server.metrics()[0], server.lookahead_stats()
            code = run_to_end(cmd, self.logs / f"client_{name}.log", {**os.environ}, a.run_timeout)
            after, stats_after = server.metrics()[0], server.lookahead_stats()
            if code != 0 or not result_path.exists():
                raise RuntimeError(
                    f"vllm bench serve exited with {code}; log {self.logs / f'client_{name}.log'}:\n"
                    + log_tail(self.logs / f"client_{name}.log", 15)
                )
            result = json.loads(result_path.read_text())
            record.update(parse_serve_result(result, metrics_delta(before, after)))
            if (lookahead := lookahead_delta(stats_before, stats_after)) is not None:
                record["lookahead"] = lookahead
            record["result_file"] = str(result_path)
            record["status"] = "ok" if record["completed"] > 0 else "failed-requests"
            if record["status"] != "ok":
                record["error"] = f"{record['failed']} of {n} requests failed"
            if server.proc is not None and server.proc.poll() is not None:
                record["status"], record["error"] = "server-died", f"see {server.log_path}"
        except (RuntimeError, OSError, KeyError, json.JSONDecodeError) as e:
            record.update(status="error", error=str(e))
        self.add(record, time.monotonic() - t0)

    def offline_run(self, rnd: int, method: str, dataset: str, model: str, max_model_len: int, files: dict) -> None:
        a = self.args
        name = f"offline_{method}_{dataset}_r{rnd}"
        out = self.raw / f"{name}.json"
        out.unlink(missing_ok=True)
        self.raw.mkdir(parents=True, exist_ok=True)  # vLLM's client does not make it (--no-serve: nothing else has)
        log = self.logs / f"{name}.log"
        record: dict[str, Any] = {
            "kind": "offline",
            "round": rnd,
            "method": method,
            "dataset": dataset,
            "concurrency": max(a.concurrency_list),
            "num_prompts": num_prompts_for(max(a.concurrency_list), a.num_prompts, a.max_prompts, a.per_slot),
            "spec_config": speculative_config(method, a),
        }
        t0 = time.monotonic()
        try:
            cmd = throughput_command(a, method, model, dataset, max_model_len, files, out)
            code = run_to_end(cmd, log, engine_env(a, method), a.run_timeout)
            if code != 0 or not out.exists():
                raise RuntimeError(f"vllm bench throughput exited with {code}; log {log}:\n{log_tail(log, 15)}")
            record.update(
                parse_throughput_result(json.loads(out.read_text()), log.read_text(errors="replace"), a.output_len)
            )
            record.update(status="ok", result_file=str(out))
        except (RuntimeError, OSError, KeyError, json.JSONDecodeError) as e:
            record.update(status="error", error=str(e))
        self.add(record, time.monotonic() - t0)

    def run(self) -> int:
        a = self.args
        from transformers import AutoTokenizer

        from vllm_lookahead.tools import cpu_runtime

        model = bench.model_path(a.model)
        model = str(Path(model).resolve()) if Path(model).exists() else model
        tokenizer = AutoTokenizer.from_pretrained(model)
        files, longest, notes = write_datasets(a, tokenizer, self.folder / "datasets")
        max_model_len = a.max_model_len or max_model_len_for(longest, a.output_len)
        runtime = cpu_runtime.describe(cpu_runtime.environment()) if a.runtime == "project" else "vLLM defaults"
        self.settings = {
            **{k: v for k, v in vars(a).items() if not k.endswith("_list")},
            "methods": a.method_list,
            "datasets": a.dataset_list,
            "concurrency": a.concurrency_list,
            "num_prompts_per_concurrency": files["counts"],
            "model": model,
            "max_model_len": max_model_len,
            "longest_prompt_tokens": longest,
            "runtime": runtime,
            "kv_cache_gib": engine_env(a, "none")["VLLM_CPU_KVCACHE_SPACE"],
            "notes": notes,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        for note in notes:
            print(f"note: {note}", flush=True)
        print(f"{self.tag}: model {model}, {a.dtype}, max_model_len {max_model_len}, {runtime}", flush=True)
        self.run_rounds(model, max_model_len, files)
        self.report()
        return 0 if any(r["status"] == "ok" for r in self.records) else 1

    def run_rounds(self, model: str, max_model_len: int, files: dict[str, Any]) -> None:
        """Each round's serve runs (`--serve`), then its offline runs (`--offline`); a method whose package is
        missing gets a skipped record for each run it would have made, and no other."""
        a = self.args
        missing = {m: REQUIRES[m] for m in a.method_list if m in REQUIRES and not _importable(REQUIRES[m][0])}
        kinds = [kind for kind, on in (("serve", a.serve), ("offline", a.offline)) if on]
        for rnd in range(a.rounds):
            order = run_order(a.method_list, rnd)  # rotated: no method always first or last
            for method in (m for m in order if m in missing):
                for kind in kinds:
                    self._skip(rnd, method, kind, f"{missing[method][0]} is not installed ({missing[method][1]})")
            if a.serve:
                self.serve_round(rnd, [m for m in order if m not in missing], model, max_model_len, files)
            if a.offline:
                for method in order:
                    if method not in missing:
                        for dataset in a.dataset_list:
                            self.offline_run(rnd, method, dataset, model, max_model_len, files)

    def _skip(self, rnd: int, method: str, kind: str, reason: str) -> None:
        concs = self.args.concurrency_list if kind == "serve" else [max(self.args.concurrency_list)]
        for dataset in self.args.dataset_list:
            for c in concs:
                record = {"kind": kind, "round": rnd, "method": method, "dataset": dataset, "concurrency": c}
                self.add({**record, "status": "skipped", "error": reason}, 0.0)

    def report(self) -> None:
        write_report(self.records, self.args, self.settings, self.out, self.tag)
        self.save()
        print(f"results: {self.out / (self.tag + '.json')}; logs and vLLM's raw results: {self.folder}")


def write_report(
    records: Sequence[dict[str, Any]], args: argparse.Namespace, settings: dict[str, Any], out: Path, tag: str
) -> None:
    """Print and write TAG.md (lookahead against the others, then every run) and plot TAG.png."""
    a = args
    rows = summarize(records, a.method_list)
    title = (
        f"{a.dtype}, {'eager' if a.eager else 'compiled'}, output {a.output_len} tokens, "
        f"temperature {a.temperature:g} (offline: 1.0), {a.rounds} round(s); {settings.get('runtime', '')}"
    )
    table = f"# bench_serve {tag}\n\n{title}\n\n"
    if "lookahead" in a.method_list and "none" in a.method_list and any(r["kind"] == "serve" for r in rows):
        table += "## lookahead against the others (vllm bench serve)\n\n" + headline(records, a.method_list)
        table += "\n## Every run\n\n"
    table += format_table(rows)
    print("\n" + table)
    (out / f"{tag}.md").write_text(table, encoding="utf-8")
    png = out / f"{tag}.png"
    try:
        plot(rows, a.dataset_list, a.method_list, png, f"bench_serve {tag}\n{title}")
        print(f"plot: {png}")
    except Exception as e:  # the table and JSON are the results; a plot failure must not lose them
        print(f"plot failed: {e}", file=sys.stderr)


def report_saved(path: Path) -> int:
    """`--report TAG.json`: the tables and plot again from a saved run (one cut short included), nothing rerun."""
    data = json.loads(path.read_text(encoding="utf-8"))
    s = data["settings"]
    args = argparse.Namespace(**{**s, "method_list": s["methods"], "dataset_list": s["datasets"]})
    write_report(data["records"], args, s, path.parent, path.stem)
    return 0


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _on_signal(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        return report_saved(Path(args.report))
    sweep = Sweep(args)
    sweep.out.mkdir(parents=True, exist_ok=True)
    # SIGTERM / SIGHUP take the same path as Ctrl-C: through every `finally`, so no server outlives the script.
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    try:
        return sweep.run()
    except OutOfMemory as e:
        print(f"bench_serve: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: servers stopped; results so far saved", file=sys.stderr)
        if sweep.records:
            sweep.save()
        return 130
    finally:
        devserver.stop_all()


if __name__ == "__main__":
    sys.exit(main())
