"""Long sequences: lookahead's tokens per forward and step cost against context length, and its memory and drafting
time against generated length, up to 8k tokens (the default model's limit).

    python benchmarks/bench_long.py                      # contexts 256..8000, both sets, float32 and bfloat16
    python benchmarks/bench_long.py --dtypes float32 --contexts 256,2048 --reps 1 --gen-tokens 1024   # quick

Two sweeps, each engine in a subprocess with vLLM in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, async scheduling
off), driven step by step through vLLM's own `LLMEngine.step` and each step timed by the clock from outside
(`bench.step_clock`: a step's whole cost, scheduling and output processing included). Nothing of vLLM or of the
plugin is replaced or wrapped:

- context: for every context L and set (HumanEval prompts and ShareGPT first turns, each concatenated into one long
  text), `--reps` prompts of L tokens, each ending at one of `--reps` fixed points of the text (so every L continues
  the same text, with more of what came before it in the cache), each decoded greedily for `--new-tokens`
  tokens twice in one lookahead engine: once opted out (`extra_args={"lookahead": False}`: plain decoding) and once
  with lookahead. The prompt is cached first (prefix caching), so both runs' steps are decoding steps against the
  same L cached tokens. Per (dtype, set, L): tokens per forward, the median step of each, the lookahead step's cost
  against the plain one, and lookahead's tokens/s against plain decoding's (whole decode times). In float32 the
  two outputs must be identical; mismatches are counted.
- generation (first dtype only): one HumanEval prompt decoded with lookahead for `--gen-tokens` tokens (EOS
  ignored; sampled at temperature 1, seed 0: greedy decoding of this small model, and sampling at lower
  temperatures, fall into loops that teach the pool and the index nothing new; pure sampling keeps adding new
  n-grams, the case that grows them most). After every step: the request's n-gram pool keys and prompt-lookup index
  keys (read from the worker's lookahead state through `collective_rpc`, outside the step's time), the step's time
  and the process RSS; summarised at generated lengths 256, 512, 1k, .. and plotted. (Drafting alone is not timed:
  that would take a timer inside the plugin; `diagnostics/profile_engine.py` shows its share under cProfile.)

Prints markdown tables, saves a PNG (four panels) and appends every row to a JSONL file, both under `--out`. Runs
under the project's CPU runtime (vllm_lookahead.tools.cpu_runtime) like the other benchmarks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vllm_lookahead.devtools import bench

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

MAX_MODEL_LEN = 8192
OFFSET = 1500  # tokens between the end points of one context's repetitions
SETS = ("humaneval", "sharegpt")


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--contexts", default="256,512,1024,2048,4096,8000", help="prompt lengths in tokens")
    p.add_argument("--sets", default="humaneval,sharegpt")
    p.add_argument("--reps", type=int, default=3, help="prompts per (set, context), from different offsets")
    p.add_argument("--new-tokens", type=int, default=96, help="tokens decoded per prompt in the context sweep")
    p.add_argument("--gen-tokens", type=int, default=7800, help="tokens of the generation sweep (0: skip it)")
    p.add_argument("--out", default=bench.RESULTS)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.dtype_list = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    args.context_list = _ints(args.contexts)
    args.set_list = [s.strip() for s in args.sets.split(",") if s.strip()]
    if any(s not in SETS for s in args.set_list):
        p.error(f"--sets: each must be one of {', '.join(SETS)}")
    if args.reps < 1 or args.new_tokens < 2:
        p.error("--reps must be >= 1 and --new-tokens >= 2")
    longest = max(args.context_list) + args.new_tokens + 64  # room for the last step's tree
    if min(args.context_list) < 16 or longest > MAX_MODEL_LEN:
        p.error(f"--contexts: each in 16..{MAX_MODEL_LEN - args.new_tokens - 64} (the model's limit with room)")
    if not 0 <= args.gen_tokens <= MAX_MODEL_LEN - 256 - 64:
        p.error(f"--gen-tokens: 0..{MAX_MODEL_LEN - 256 - 64}")
    return args


# ----------------------------------------------------------------------------------------------- worker side


def long_text_ids(tok: Any, name: str, need: int) -> list[int]:
    """One long text of the set's prompts, at least `need` tokens."""
    from vllm_lookahead.devtools.prompts import humaneval_prompts, sharegpt_prompts

    texts = humaneval_prompts() if name == "humaneval" else sharegpt_prompts(2000)
    ids = tok("\n\n".join(texts))["input_ids"]
    if len(ids) < need:
        raise RuntimeError(f"{name}: {len(ids)} tokens, {need} needed")
    return ids


def _state_sizes(worker: Any) -> tuple[int, int] | None:
    """The one live request's n-gram pool keys and prompt-lookup index keys, read on the worker (`collective_rpc`):
    nothing is replaced, but this reads the engine's own objects, so it follows their names."""
    engine = getattr(worker.model_runner, "_lookahead", None)
    states = list(engine.requests.states.values()) if engine is not None else []
    if not states:
        return None
    state = states[0]
    return len(state.pool), len(state.lookup._index) if state.lookup is not None else 0


def context_sweep(llm: Any, args: argparse.Namespace, dtype: str) -> list[dict[str, Any]]:
    from vllm import SamplingParams

    tok = llm.get_tokenizer()
    warm = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    plain = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, extra_args={"lookahead": False})
    look = SamplingParams(temperature=0.0, max_tokens=args.new_tokens)
    rows = []
    for name in args.set_list:
        ids = long_text_ids(tok, name, (args.reps - 1) * OFFSET + max(args.context_list))
        for ctx in args.context_list:
            for rep in range(args.reps):
                end = max(args.context_list) + rep * OFFSET
                prompt = {"prompt_token_ids": ids[end - ctx : end]}
                llm.generate(prompt, warm, use_tqdm=False)  # caches the prompt's full blocks
                row: dict[str, Any] = {"dtype": dtype, "set": name, "context": ctx, "rep": rep}
                outs = {}
                for kind, sp in (("plain", plain), ("lookahead", look)):
                    final, clocked = bench.step_clock(llm, prompt, sp)
                    outs[kind] = list(final.outputs[0].token_ids)
                    steps = [seconds for seconds, _ in clocked[1:]]  # the first step prefills the uncached rest
                    row[f"{kind}_tokens"] = len(outs[kind]) - 1  # the prefill's token is not a decoding step's
                    row[f"{kind}_steps"] = len(steps)
                    row[f"{kind}_seconds"] = sum(steps)
                    row[f"{kind}_step_ms"] = 1000 * bench.median(steps) if steps else None
                row["identical"] = outs["plain"] == outs["lookahead"]
                rows.append(row)
                print(
                    f"{dtype} {name} ctx {ctx} rep {rep}: plain {row['plain_step_ms']:.1f} ms/step, lookahead "
                    f"{row['lookahead_step_ms']:.1f} ms/step, {row['lookahead_tokens'] / row['lookahead_steps']:.2f}"
                    f" tokens/forward",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def generation_sweep(llm: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    from vllm import SamplingParams

    after: list[dict[str, Any]] = []  # what the request holds after each step

    def sample(generated: int) -> None:
        sizes = llm.collective_rpc(_state_sizes)[0]
        pool, lookup = sizes if sizes is not None else (0, 0)
        after.append({"generated": generated, "pool_keys": pool, "lookup_keys": lookup, "rss_mib": bench.rss_mib()})

    prompt = {"prompt_token_ids": long_text_ids(llm.get_tokenizer(), "humaneval", 256)[:256]}
    # Pure sampling: greedy decoding of a small model (and sampling at T=0.8) loops within a few hundred tokens,
    # and a loop teaches the pool and the index nothing new; sampled text keeps them growing.
    sp = SamplingParams(temperature=1.0, seed=0, max_tokens=args.gen_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    rss = bench.rss_mib()
    _, steps = bench.step_clock(llm, prompt, sp, after_step=sample)
    samples = [
        {**a, "step_ms": 1000 * seconds, "made": made}
        for a, (seconds, made) in list(zip(after, steps, strict=True))[1:]  # past the prefill
    ]
    print(f"generation: {time.perf_counter() - t0:.0f} s, RSS {rss:.0f} -> {bench.rss_mib():.0f} MiB", file=sys.stderr)
    return [{"kind": "generation", "rss_before_mib": rss, "rss_after_mib": bench.rss_mib(), "samples": samples}]


def worker(args: argparse.Namespace) -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, stepped by step_clock
    kind, dtype = args.worker.split(":")
    from vllm import LLM

    llm = LLM(
        model=bench.model_path(),
        dtype=dtype,
        max_model_len=MAX_MODEL_LEN,
        seed=0,
        enforce_eager=True,
        max_num_seqs=1,
        enable_prefix_caching=True,
        async_scheduling=False,
        speculative_config={"method": "lookahead"},
    )
    rows = context_sweep(llm, args, dtype) if kind == "context" else generation_sweep(llm, args)
    Path(args.result_file).write_text(json.dumps(rows))
    return 0


# ------------------------------------------------------------------------------------------------- main side


def summarise_contexts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (dtype, set, context): the reps pooled."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["dtype"], r["set"], r["context"]), []).append(r)
    out = []
    for (dtype, name, ctx), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        s = {k: sum(r[k] for r in rs) for k in rs[0] if k.endswith(("_tokens", "_steps", "_seconds"))}
        plain_ms = sorted(r["plain_step_ms"] for r in rs)[len(rs) // 2]
        look_ms = sorted(r["lookahead_step_ms"] for r in rs)[len(rs) // 2]
        tpf = s["lookahead_tokens"] / s["lookahead_steps"]
        speed = (s["lookahead_tokens"] / s["lookahead_seconds"]) / (s["plain_tokens"] / s["plain_seconds"])
        out.append(
            {
                "dtype": dtype,
                "set": name,
                "context": ctx,
                "prompts": len(rs),
                "identical": sum(r["identical"] for r in rs),
                "plain_step_ms": plain_ms,
                "lookahead_step_ms": look_ms,
                "step_cost": look_ms / plain_ms,
                "tokens_per_forward": tpf,
                "speedup": speed,
                **s,
            }
        )
    return out


CHECKPOINTS = (256, 512, 1024, 2048, 4096, 8192)


def summarise_generation(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At each checkpoint c: the sizes at the last step before c, and the medians over (c/2, c]."""
    out = []
    for c in CHECKPOINTS:
        span = [s for s in samples if c // 2 < s["generated"] <= c]
        if len(span) < 2:
            continue
        last = span[-1]
        out.append(
            {
                "generated": last["generated"],
                "pool_keys": last["pool_keys"],
                "lookup_keys": last["lookup_keys"],
                "rss_mib": last["rss_mib"],
                "step_ms": bench.median(s["step_ms"] for s in span),
                "step_ms_max": max(s["step_ms"] for s in span),
                "tokens_per_forward": (span[-1]["generated"] - span[0]["generated"]) / max(1, len(span) - 1),
            }
        )
    return out


def context_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| dtype | set | context | prompts | identical | plain ms/step | lookahead ms/step | step cost vs plain "
        "| tokens/forward | tokens/s vs plain |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = [r["dtype"], r["set"], str(r["context"]), str(r["prompts"]), f"{r['identical']}/{r['prompts']}"]
        cells += [f"{r['plain_step_ms']:.1f}", f"{r['lookahead_step_ms']:.1f}", f"{r['step_cost']:.2f}x"]
        cells += [f"{r['tokens_per_forward']:.2f}", f"{r['speedup']:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def generation_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| generated tokens | pool keys | lookup index keys | step ms (median) | step ms (max) "
        "| tokens/forward (since half) | process RSS (MiB) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = [str(r["generated"]), str(r["pool_keys"]), str(r["lookup_keys"]), f"{r['step_ms']:.1f}"]
        cells += [f"{r['step_ms_max']:.1f}", f"{r['tokens_per_forward']:.2f}"]
        cells.append(f"{r['rss_mib']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(ctx_rows: list[dict[str, Any]], samples: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    series = sorted({(r["dtype"], r["set"]) for r in ctx_rows})
    for ax, key, label in (
        (axes[0][0], "tokens_per_forward", "tokens per forward (lookahead)"),
        (axes[0][1], "step_cost", "lookahead step / plain step   and   tokens/s vs plain"),
    ):
        for dtype, name in series:
            pts = [r for r in ctx_rows if r["dtype"] == dtype and r["set"] == name]
            xs = [r["context"] for r in pts]
            style = "-" if dtype == "float32" else "--"
            (line,) = ax.plot(xs, [r[key] for r in pts], "o" + style, label=f"{name} {dtype}")
            if key == "step_cost":
                ax.plot(xs, [r["speedup"] for r in pts], "s" + style, color=line.get_color(), alpha=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens in the cache)")
        ax.set_ylabel(label)
        ax.grid(True, linewidth=0.4, alpha=0.5)
    axes[0][1].axhline(1.0, color="grey", linewidth=0.8)
    axes[0][1].set_title("circles: step cost, squares: tokens/s vs plain", fontsize=8)
    axes[0][0].legend(fontsize=8)
    if samples:
        xs = [s["generated"] for s in samples]
        ax = axes[1][0]
        ax.plot(xs, [s["pool_keys"] for s in samples], label="n-gram pool keys")
        ax.plot(xs, [s["lookup_keys"] for s in samples], label="prompt-lookup index keys")
        ax.set_xlabel("generated tokens")
        ax.set_ylabel("keys held by the request")
        ax.legend(fontsize=8)
        ax.grid(True, linewidth=0.4, alpha=0.5)
        ax = axes[1][1]
        ax.plot(xs, [s["step_ms"] for s in samples], ",", alpha=0.5, label="engine step")
        ax.set_xlabel("generated tokens")
        ax.set_ylabel("ms")
        ax.legend(fontsize=8, markerscale=20)
        ax.grid(True, linewidth=0.4, alpha=0.5)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_child(argv: list[str], job: str) -> list[dict[str, Any]] | None:
    with tempfile.TemporaryDirectory(prefix="bench-long-") as tmp:
        rf = Path(tmp) / "r.json"
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--worker", job, "--result-file", str(rf)]
        rc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr).returncode
        if rc == 0 and rf.exists():
            return json.loads(rf.read_text())
    print(f"warning: {job} failed (exit {rc})", file=sys.stderr)
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    from tqdm import tqdm

    runtime = bench.apply_runtime("project")
    jobs = [f"context:{d}" for d in args.dtype_list]
    if args.gen_tokens:
        jobs.append(f"generation:{args.dtype_list[0]}")
    ctx_raw: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    for job in tqdm(jobs, desc="engines", file=sys.stderr):
        res = run_child(argv, job)
        if res is None:
            return 1
        if job.startswith("context"):
            ctx_raw += res
        else:
            samples = res[0]["samples"]
    ctx_rows = summarise_contexts(ctx_raw)
    gen_rows = summarise_generation(samples)
    print(f"\n### Tokens per forward and step cost against context (batch 1, {args.new_tokens} tokens; {runtime})\n")
    print(context_table(ctx_rows))
    if gen_rows:
        print(f"\n### Memory and step time against generated length ({args.dtype_list[0]}, one request)\n")
        print(generation_table(gen_rows))
    bad = [r for r in ctx_rows if r["dtype"] == "float32" and r["identical"] < r["prompts"]]
    for r in bad:
        print(f"MISMATCH float32 {r['set']} ctx {r['context']}: {r['prompts'] - r['identical']} outputs differ")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"long_ctx{'-'.join(map(str, args.context_list))}_gen{args.gen_tokens}"
    png = out / f"{stem}.png"
    title = f"Long sequences, default model, batch 1, {runtime}"
    plot(ctx_rows, samples, png, title)
    print(f"\nchart: {png}")
    settings = vars(args) | {"worker": None, "result_file": None}
    bench.append_jsonl(out / f"{stem}.jsonl", settings, ctx_rows + [{"kind": "generation", "rows": gen_rows}])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
