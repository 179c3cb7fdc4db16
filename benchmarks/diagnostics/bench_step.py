"""What an engine step costs: lookahead trees of several sizes against plain steps over as many tokens, at several
contexts (batch 1).

    python benchmarks/diagnostics/bench_step.py          # float32 and bfloat16, trees 8..64, contexts 128..1536
    python benchmarks/diagnostics/bench_step.py --dtypes bfloat16 --trees 24 --contexts 512 --new-tokens 24  # quick
    python benchmarks/diagnostics/bench_step.py --paired   # bare(T) timed in each tree's own engine, between its steps

Every configuration runs in a fresh subprocess with vLLM's engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0,
async scheduling off), driven step by step through vLLM's own `LLMEngine.step` and each step timed by the clock
from outside (`bench.step_clock`): a step's whole cost, scheduling, forward, logits, sampling and verification,
drafting and output processing. Nothing of vLLM or of the plugin is replaced or wrapped; for where a step's Python
time goes, run `profile_engine.py` (cProfile), and for the attention alone `bench_tree_attention.py`.

Trees have an exact size: a wide window (W=40, N=3) fills any tree, every node pays (`node_cost` 0, so the
measured-cost sizing keeps them all) and `step_token_budget` cuts it to T nodes (the table's drafts a step, from
vLLM's speculative counters, says what was carried). `bare(T), 1 row` is a plain engine step that computes T new
tokens against the same cached context (prefix caching on a block-aligned prompt) and the logits of its last row,
as vLLM's prefill does; `bare(T)` adds the logits of the other T - 1 rows, timed on the engine's own LM head
(`compute_logits` over T rows against 1): the least a step that verifies T tokens can cost (vLLM's ngram and suffix
methods compute logits for every draft token too). By default the bare steps run in a plain engine of their own;
`--paired` times each tree size's bare steps in that tree's own lookahead engine, alternating with its tree steps (the
bare requests opt out of lookahead with `extra_args={"lookahead": False}`), so that both see the machine in the same
minutes. Prints a table per dtype and saves a PNG per dtype plus a JSONL of every row (`--out`), whose bare rows
give `step` (ms, all T rows of logits) per (dtype, context, tokens): `bench_scaling.py` and `bench_flops.py` read
them. Runs under the project's CPU runtime (`--runtime project`) unless `--runtime vllm`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from vllm_lookahead.devtools import bench

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

BLOCK = 128  # vLLM's CPU block size: bare-step prompts are multiples of it, so prefix caching covers them
WARM_STEPS = 3  # a tree run's first steps (the prefill, the window filling) are left out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--trees", default="8,16,24,32,64", help="lookahead tree sizes in nodes (x0 included)")
    p.add_argument("--contexts", default="128,512,1536", help="cached tokens before the measured steps")
    p.add_argument("--new-tokens", type=int, default=48, help="tokens generated per context and tree")
    p.add_argument("--repeats", type=int, default=3, help="bare steps per (context, T)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every configuration this many times, round by round, and take the medians over all rounds' "
        "steps: a noisy machine's slow spells then fall on bare and lookahead steps alike",
    )
    p.add_argument("--model", default=None, help="a registered model name (tools.models) or a folder")
    runtimes = "project: the CPU runtime `make` sets up (tools.cpu_runtime); vllm: vLLM's defaults"
    p.add_argument("--runtime", default="project", choices=["project", "vllm"], help=runtimes)
    p.add_argument("--bare-only", action="store_true", help="only the bare steps (the cost curve of T tokens)")
    p.add_argument(
        "--paired",
        action="store_true",
        help="time each tree size's bare steps in the lookahead engine's own process, alternating with its tree "
        "steps (the bare requests opt out of lookahead), instead of in a plain engine of their own",
    )
    p.add_argument("--out", default=bench.RESULTS)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.dtype_list = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    args.tree_list = [int(t) for t in args.trees.split(",") if t.strip()]
    args.context_list = [int(c) for c in args.contexts.split(",") if c.strip()]
    if args.rounds < 1 or args.repeats < 1 or args.new_tokens <= WARM_STEPS:
        p.error(f"--rounds and --repeats must be at least 1, --new-tokens above {WARM_STEPS}")
    if args.paired and args.bare_only:
        p.error("--paired times bare steps beside tree steps: it cannot go with --bare-only")
    if any(t < 2 or t > 96 for t in args.tree_list):
        p.error("--trees: each size must be in 2..96")
    if any(c < BLOCK or c % BLOCK for c in args.context_list):
        p.error(f"--contexts: each must be a positive multiple of {BLOCK}")
    return args


# ----------------------------------------------------------------------------------------------- worker side


def _logits_seconds(worker: Any, rows: int, reps: int = 7) -> float:
    """Median seconds of the model's own LM head (`compute_logits`) over `rows` hidden rows; run on the worker by
    `collective_rpc`, which calls it without replacing anything."""
    import torch

    model = worker.model_runner.model
    hidden = torch.randn(rows, model.config.hidden_size, dtype=worker.model_runner.dtype)
    times = []
    with torch.inference_mode():
        model.compute_logits(hidden)  # warm
        for _ in range(reps):
            t = time.perf_counter()
            model.compute_logits(hidden)
            times.append(time.perf_counter() - t)
    return bench.median(times)


def worker(args: argparse.Namespace) -> int:
    from vllm import LLM, SamplingParams

    from vllm_lookahead.devtools.prompts import humaneval_prompts

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, stepped by step_clock
    kind, dtype = args.worker.split(":")
    common = dict(
        model=bench.model_path(args.model), dtype=dtype, max_model_len=2048, seed=0, enforce_eager=True,
        max_num_seqs=1, async_scheduling=False, disable_log_stats=False, enable_prefix_caching=True,
    )  # fmt: skip
    tree = 0 if kind == "bare" else int(kind.split("=")[1])
    if kind == "bare":
        llm = LLM(**common)
    else:
        spec = {"method": "lookahead", "window_size": 40, "ngram_size": 3, "step_token_budget": tree, "node_cost": 0.0}
        llm = LLM(**common, speculative_config=spec)
    text_ids = llm.get_tokenizer()("\n".join(humaneval_prompts(40)))["input_ids"]
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm.generate({"prompt_token_ids": text_ids[:200]}, greedy, use_tqdm=False)  # warm-up
    # Bare requests opt out of lookahead: in the paired mode they run in the lookahead engine as plain prefills.
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, extra_args={"lookahead": False})
    logits: dict[int, float] = {}

    def bare_steps(ctx: int, rep: int, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
        base = text_ids[rep * 7 : rep * 7 + ctx]  # a fresh prefix per repetition
        llm.generate({"prompt_token_ids": base}, one, use_tqdm=False)  # caches the prefix
        out = []
        for t in sizes:
            extra = text_ids[3000 + t : 3000 + 2 * t]  # never cached
            final, steps = bench.step_clock(llm, {"prompt_token_ids": base + extra}, one)
            if len(steps) != 1 or final.num_cached_tokens != ctx:
                raise RuntimeError(f"prefix caching missed: {final.num_cached_tokens} of {ctx} tokens cached, "
                                   f"{len(steps)} steps for {t} new tokens")  # fmt: skip
            if t not in logits:
                logits[t] = llm.collective_rpc(_logits_seconds, args=(t,))[0]
            out.append({"context": ctx, "tokens": t, "step_1row": steps[0][0], "logits": logits[t]})
        return out

    def tree_steps(ctx: int, start: int = 0) -> list[dict[str, Any]]:
        sp = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
        before = bench.spec_counters(llm)
        _, steps = bench.step_clock(llm, {"prompt_token_ids": text_ids[start : start + ctx]}, sp)
        spec = bench.counters_since(before, bench.spec_counters(llm))
        drafts = spec["draft_tokens"] / spec["drafts"] if spec["drafts"] else 0.0
        return [{"context": ctx, "tokens": tree, "step": s, "made": n, "drafts": drafts} for s, n in steps[WARM_STEPS:]]

    kept: list[dict[str, Any]] = []
    bare_kept: list[dict[str, Any]] = []
    for ctx in args.context_list:
        if kind == "bare":
            for rep in range(args.repeats):
                bare_kept += bare_steps(ctx, rep, (1, *args.tree_list))
        elif args.paired:  # bare(T) and tree steps alternate, seconds apart, in this one process
            for rep in range(args.repeats):
                bare_kept += bare_steps(ctx, rep, (1, tree))
                kept += tree_steps(ctx, start=rep * 11)
        else:
            kept += tree_steps(ctx)
    results = [{"kind": kind, "dtype": dtype, "records": kept}] if kept else []
    if bare_kept:
        results.append({"kind": "bare", "dtype": dtype, "records": bare_kept})
    Path(args.result_file).write_text(json.dumps(results))
    return 0


# ------------------------------------------------------------------------------------------------- main side


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (dtype, kind, context, tokens): the median step (ms) and, for bare steps, the median 1-row step and the LM
    head's time over T rows; each lookahead row against the bare steps of its size. A bare row's `step` is bare(T):
    its 1-row step plus the logits of the other T - 1 rows."""
    groups: dict[tuple[str, str, int, int], list[dict[str, Any]]] = defaultdict(list)
    for res in results:
        for r in res["records"]:
            groups[(res["dtype"], res["kind"], r["context"], r["tokens"])].append(r)
    logits_1 = {
        (d, c): bench.median(r["logits"] for r in rs) for (d, k, c, t), rs in groups.items() if k == "bare" and t == 1
    }
    rows = []
    for (dtype, kind, ctx, tokens), recs in sorted(groups.items()):
        row: dict[str, Any] = {"dtype": dtype, "kind": kind, "context": ctx, "tokens": tokens, "n": len(recs)}
        if kind == "bare":
            row["step_1row"] = 1e3 * bench.median(r["step_1row"] for r in recs)
            row["logits"] = 1e3 * bench.median(r["logits"] for r in recs)
            row["step"] = row["step_1row"] + row["logits"] - 1e3 * logits_1.get((dtype, ctx), row["logits"] / 1e3)
        else:
            row["step"] = 1e3 * bench.median(r["step"] for r in recs)
            row["drafts_per_step"] = bench.median(r["drafts"] for r in recs)
            row["tokens_per_step"] = sum(r["made"] for r in recs) / len(recs)
        rows.append(row)
    bare = {(r["dtype"], r["context"], r["tokens"]): r for r in rows if r["kind"] == "bare"}
    for r in rows:
        b = bare.get((r["dtype"], r["context"], r["tokens"]))
        r["bare_step"] = b["step"] if b else None
        r["bare_step_1row"] = b["step_1row"] if b else None
        theirs = b is not None and r["kind"] != "bare"  # a bare row against itself says nothing
        r["step_vs_bare"] = r["step"] / b["step"] if theirs else None
        r["step_vs_bare_1row"] = r["step"] / b["step_1row"] if theirs else None
    return rows


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def markdown(rows: list[dict[str, Any]], dtype: str) -> str:
    head = ("| context | step | T | drafts/step | tokens/step | step ms | bare(T) | step / bare(T) | bare(T), 1 row "
            "| step / bare(T), 1 row | logits of T rows |")  # fmt: skip
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r["dtype"] != dtype:
            continue
        plain = r["kind"] == "bare"
        cells = [str(r["context"]), "plain (bare)" if plain else "lookahead", str(r["tokens"])]
        cells += ["-", "-"] if plain else [f"{r['drafts_per_step']:.1f}", f"{r['tokens_per_step']:.2f}"]
        cells += [_ms(r["step"]), _ms(r["bare_step"]), _ratio(r["step_vs_bare"]), _ms(r["bare_step_1row"])]
        cells += [_ratio(r["step_vs_bare_1row"]), _ms(r.get("logits"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], dtype: str, path: Path, model: str = "default model") -> None:
    """Per context: ms a step against T, lookahead's tree steps beside bare(T) and bare(T), 1 row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = sorted({r["context"] for r in rows if r["dtype"] == dtype})
    fig, axes = plt.subplots(1, len(contexts), figsize=(5 * len(contexts), 4.2), sharey=True, squeeze=False)
    for ax, ctx in zip(axes[0], contexts, strict=True):
        here = sorted((r for r in rows if r["dtype"] == dtype and r["context"] == ctx), key=lambda r: r["tokens"])
        tree = [r for r in here if r["kind"] != "bare"]
        bare = [r for r in here if r["kind"] == "bare"]
        ax.plot([r["tokens"] for r in tree], [r["step"] for r in tree], "o-", label="lookahead step, T-node tree")
        ax.plot([r["tokens"] for r in bare], [r["step"] for r in bare], "k--o", label="bare(T): T rows of logits")
        ax.plot([r["tokens"] for r in bare], [r["step_1row"] for r in bare], "k:", label="bare(T), 1 row")
        ax.set_xlabel("tokens a step computes (T)")
        ax.set_title(f"context {ctx}")
    axes[0][0].set_ylabel("ms per engine step (median)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Engine steps, {dtype}, {model}, batch 1")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_child(argv: list[str], kind: str, dtype: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        rf = Path(tmp) / "r.json"
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            *argv,
            "--worker",
            f"{kind}:{dtype}",
            "--result-file",
            str(rf),
        ]
        rc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr).returncode
        if rc == 0 and rf.exists():
            return json.loads(rf.read_text())
    print(f"warning: {kind} {dtype} failed (exit {rc})", file=sys.stderr)
    return []


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    from tqdm import tqdm

    runtime = bench.apply_runtime(args.runtime)
    tree_path = "reference" if os.environ.get("VLLM_LOOKAHEAD_TREE_KERNEL") == "0" else "kernel"
    trees = () if args.bare_only else tuple(f"tree={t}" for t in args.tree_list)
    kinds = list(trees) if args.paired else ["bare", *trees]  # paired: each tree's process times its bare steps
    jobs = [(k, d) for _ in range(args.rounds) for d in args.dtype_list for k in kinds]
    results = []
    for kind, dtype in tqdm(jobs, desc="configurations", file=sys.stderr):
        results += run_child(argv, kind, dtype)
    rows = summarise(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"step_T{'-'.join(map(str, args.tree_list))}_ctx{'-'.join(map(str, args.context_list))}"
    stem += ("_vllm-runtime" if args.runtime == "vllm" else "") + ("_reference" if tree_path == "reference" else "")
    stem += f"_{Path(args.model).name}" if args.model else ""
    stem += "_bare" if args.bare_only else ""
    stem += "_paired" if args.paired else ""
    model = Path(args.model).name if args.model else "default model"
    for dtype in args.dtype_list:
        print(f"\n### {dtype} (ms per engine step, medians; batch 1; {model}; {runtime})\n")
        print(markdown(rows, dtype))
        png = out / f"{stem}_{dtype}.png"
        plot(rows, dtype, png, model)
        print(f"\nchart: {png}")
    bench.append_jsonl(out / f"{stem}.jsonl", vars(args) | {"worker": None, "runtime_line": runtime}, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
