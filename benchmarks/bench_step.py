"""Where an engine step's time goes: plain decoding and lookahead trees of several sizes, at several contexts.

    python benchmarks/bench_step.py                       # float32 and bfloat16, trees 8..64, contexts 128..1536
    python benchmarks/bench_step.py --dtypes bfloat16 --trees 24 --contexts 512 --new-tokens 24   # quick
    python benchmarks/bench_step.py --paired      # bare(T) timed in each tree's own process, between its steps

Every configuration runs in a fresh subprocess with vLLM's engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so
this script can time vLLM's and the plugin's functions from outside by wrapping them: the plugin itself carries no
timers and pays nothing. Per engine step (execute_model + sample_tokens) it records:

- forward: the model's forward pass, of which `stock attn` (vLLM's CPU attention kernel, all layers: with trees, on
  the plain rows only) and `tree attn` (the tree rows, all layers: the compiled kernel's calls and its per-step
  set-up; with `VLLM_LOOKAHEAD_TREE_KERNEL=0`, the plain-torch recompute after the stock kernel ran on every row);
  `logits`: the LM head (after the forward) over every row that needs one: every tree node for lookahead, the last
  token for a plain step;
- sample+verify: vLLM's sampler plus the plugin's tree verification (`finish_step`), of which `kv move`;
- drafting: the plugin's `propose` (pool, window, lookup, tree build) and `begin_step` (positions, masks);
- rest: everything else of the step (vLLM's input preparation, bookkeeping).

Trees have an exact size: a wide window (W=40, N=3) fills any tree, every node pays (`node_cost` 0, so the
measured-cost sizing keeps them all) and `step_token_budget` cuts it to T nodes.
`bare(T)` is the cost of a plain engine step that computes T new tokens against the same cached context (prefix
caching on a block-aligned prompt) and the logits of all T rows, i.e. the least a step that verifies T tokens can
cost (vLLM's ngram and suffix methods compute logits for every draft token too); T=1 is a plain decode step. The
table also gives `bare(T), 1 row`: the same step with the logits of its last row only (vLLM's prefill), derived as
bare(T) - its logits + bare(1)'s logits. By default the bare steps run in a plain engine of their own; `--paired`
times each tree size's bare(T) in that tree's own lookahead engine, alternating with its tree steps (the bare
requests opt out of lookahead with `extra_args={"lookahead": False}`), so that both see the machine in the same
minutes: on a shared machine the separate processes' slow spells otherwise land on one side of the ratio.
Prints tables and saves a PNG per dtype plus a JSONL of every record (`--out`). Runs under the project's CPU
runtime (`--runtime project`, vllm_lookahead.tools.cpu_runtime) unless `--runtime vllm`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _results import append_jsonl  # the scripts run from benchmarks/, which is on sys.path

from vllm_lookahead.tools import cpu_runtime

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

PARTS = ("forward", "stock_attn", "tree_attn", "logits", "sample_verify", "kv_move", "drafting", "step")
BLOCK = 128  # vLLM's CPU block size: bare-forward prompts are multiples of it, so prefix caching covers them


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--trees", default="8,16,24,32,64", help="lookahead tree sizes in nodes (x0 included)")
    p.add_argument("--contexts", default="128,512,1536", help="cached tokens before the measured steps")
    p.add_argument("--new-tokens", type=int, default=48, help="tokens generated per context (lookahead and plain)")
    p.add_argument("--repeats", type=int, default=3, help="bare-forward repetitions per (context, T)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every configuration this many times, round by round, and take the medians over all rounds' "
        "steps: a noisy machine's slow spells then fall on bare and lookahead steps alike",
    )
    p.add_argument(
        "--model", default=None, help="a registered model name (vllm_lookahead.tools.models) or a folder; default: embedded"
    )
    p.add_argument(
        "--runtime",
        default="project",
        choices=["project", "vllm"],
        help="project: the CPU runtime `make` sets up (vllm_lookahead.tools.cpu_runtime); vllm: vLLM's defaults",
    )
    p.add_argument(
        "--bare-only", action="store_true", help="only the bare steps (the cost curve of T tokens), no lookahead runs"
    )
    p.add_argument(
        "--paired",
        action="store_true",
        help="time each tree size's bare(T) steps in the lookahead engine's own process, alternating with its "
        "tree steps (the bare requests opt out of lookahead), instead of in a plain engine of their own",
    )
    p.add_argument("--out", default="benchmarks/results/")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.dtype_list = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    args.tree_list = [int(t) for t in args.trees.split(",") if t.strip()]
    args.context_list = [int(c) for c in args.contexts.split(",") if c.strip()]
    if args.rounds < 1:
        p.error("--rounds: must be at least 1")
    if args.paired and args.bare_only:
        p.error("--paired times bare steps beside tree steps: it cannot go with --bare-only")
    if any(t < 2 or t > 96 for t in args.tree_list):
        p.error("--trees: each size must be in 2..96")
    if any(c < BLOCK or c % BLOCK for c in args.context_list):
        p.error(f"--contexts: each must be a positive multiple of {BLOCK}")
    return args


# ----------------------------------------------------------------------------------------------- worker side


class StepTimer:
    """Wraps vLLM's and the plugin's functions (class or module attributes) to time each engine step's parts."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.cur: dict[str, float] | None = None

    def wrap(self, owner: Any, attr: str, part: str, opens: bool = False, closes: bool = False) -> None:
        fn = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        timer = self

        def timed(*a: Any, **k: Any) -> Any:
            if opens and timer.cur is None:
                timer.cur = defaultdict(float)
                timer.cur["scheduled"] = a[1].total_num_scheduled_tokens  # execute_model(self, scheduler_output)
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                dt = time.perf_counter() - t0
                if timer.cur is not None:
                    timer.cur[part] += dt
                    if closes:
                        timer.records.append(dict(timer.cur))
                        timer.cur = None

        setattr(owner, attr, timed)

    def install(self) -> None:
        import vllm._custom_ops as ops
        from vllm.model_executor.layers.logits_processor import LogitsProcessor
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        from vllm_lookahead import plugin
        from vllm_lookahead.backends.cpu import kernel as tree_kernel
        from vllm_lookahead.backends.cpu import plan as tree_attention_plan
        from vllm_lookahead.backends.cpu import reference as tree_attention
        from vllm_lookahead.backends.cpu import relocation as kv_relocation
        from vllm_lookahead.glue import engine

        plugin.register()  # the plugin's patches first: the timers wrap them
        E = engine.LookaheadEngine
        self.wrap(GPUModelRunner, "execute_model", "execute", opens=True)
        self.wrap(GPUModelRunner, "sample_tokens", "sample_tokens", closes=True)
        self.wrap(GPUModelRunner, "_model_forward", "forward")
        self.wrap(GPUModelRunner, "_sample", "sample_verify")
        self.wrap(ops, "cpu_attention_with_kv_cache", "stock_attn")
        self.wrap(tree_attention, "attend_layer", "tree_attn")  # the plain-torch path
        self.wrap(tree_kernel.TreeKernel, "layer", "tree_attn")  # the compiled kernel's call per layer
        self.wrap(tree_attention_plan, "work_items", "tree_attn")  # its per-step set-up
        self.wrap(tree_attention_plan, "_plain_rows", "tree_attn")
        self.wrap(LogitsProcessor, "forward", "logits")
        self.wrap(kv_relocation, "move_kv_slots", "kv_move")
        self.wrap(E, "propose", "propose")
        self.wrap(E, "begin_step", "begin")


def logits_for_every_row() -> None:
    """A plain step computes the logits of every scheduled row, as a step verifying that many tokens must; the
    sampler still gets the last row's, so the step's output is unchanged. Installed before the timers."""
    import torch
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    forward, logits = GPUModelRunner._model_forward, LogitsProcessor.forward
    hidden: list[torch.Tensor] = []

    def model_forward(self: Any, *a: Any, **k: Any) -> Any:
        out = forward(self, *a, **k)
        hidden[:] = [out] if isinstance(out, torch.Tensor) else []
        return out

    def all_rows(self: Any, lm_head: Any, hidden_states: torch.Tensor, *a: Any, **k: Any) -> Any:
        if hidden and hidden_states.shape[0] == 1 and hidden[0].shape[0] > 1:
            return logits(self, lm_head, hidden.pop(), *a, **k)[-1:]
        return logits(self, lm_head, hidden_states, *a, **k)

    GPUModelRunner._model_forward = model_forward  # type: ignore[method-assign]
    LogitsProcessor.forward = all_rows  # type: ignore[method-assign]


def worker(args: argparse.Namespace) -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core and worker in this process: we can wrap them
    kind, dtype = args.worker.split(":")
    if kind == "bare" or args.paired:
        logits_for_every_row()  # a lookahead step's rows all have logits already: only prefill steps change
    timer = StepTimer()
    timer.install()
    from vllm import LLM, SamplingParams

    from vllm_lookahead.tools.prompts import humaneval_prompts

    model = _model_path(args.model)
    common = dict(model=model, dtype=dtype, max_model_len=2048, seed=0, enforce_eager=True, max_num_seqs=1)
    if kind == "bare":
        llm = LLM(**common, enable_prefix_caching=True)
    else:
        tree = int(kind.split("=")[1])
        spec = {"method": "lookahead", "window_size": 40, "ngram_size": 3, "step_token_budget": tree, "node_cost": 0.0}
        llm = LLM(**common, speculative_config=spec, enable_prefix_caching=args.paired)
    tok = llm.get_tokenizer()
    text_ids = tok("\n".join(humaneval_prompts(40)))["input_ids"]
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm.generate({"prompt_token_ids": text_ids[:200]}, greedy, use_tqdm=False)  # warm-up
    # Bare requests opt out of lookahead: in the paired mode they run in the lookahead engine as plain prefills.
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, extra_args={"lookahead": False})

    def bare_steps(ctx: int, rep: int, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
        base = text_ids[rep * 7 : rep * 7 + ctx]  # a fresh prefix per repetition
        llm.generate({"prompt_token_ids": base}, one, use_tqdm=False)  # caches the prefix
        out = []
        for t in sizes:
            extra = text_ids[3000 + t : 3000 + 2 * t]  # never cached
            timer.records.clear()
            llm.generate({"prompt_token_ids": base + extra}, one, use_tqdm=False)
            (r,) = timer.records  # one step: the t uncached tokens against the cached prefix
            if r["scheduled"] != t:
                raise RuntimeError(f"prefix caching missed: {r['scheduled']} tokens scheduled for {t}")
            out.append(r | {"context": ctx, "tokens": t})
        return out

    def tree_steps(ctx: int, new_tokens: int, start: int = 0) -> list[dict[str, Any]]:
        sp = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        timer.records.clear()
        llm.generate({"prompt_token_ids": text_ids[start : start + ctx]}, sp, use_tqdm=False)
        return [r | {"context": ctx, "tokens": int(kind.split("=")[1])} for r in timer.records[3:]]  # past warm-up

    kept: list[dict[str, Any]] = []
    bare_kept: list[dict[str, Any]] = []
    for ctx in args.context_list:
        if kind == "bare":
            for rep in range(args.repeats):
                kept += bare_steps(ctx, rep, (1, *args.tree_list))
        elif args.paired:  # bare(T) and tree steps alternate, seconds apart, in this one process
            tree = int(kind.split("=")[1])
            for rep in range(args.repeats):
                bare_kept += bare_steps(ctx, rep, (1, tree))
                kept += tree_steps(ctx, args.new_tokens, start=rep * 11)
        else:
            kept += tree_steps(ctx, args.new_tokens)
    results = [{"kind": kind, "dtype": dtype, "records": kept}]
    if bare_kept:
        results.append({"kind": "bare", "dtype": dtype, "records": bare_kept})
    Path(args.result_file).write_text(json.dumps(results))
    return 0


def _model_path(name: str | None) -> str:
    """A registered model's folder (prepared if need be), a folder as given, or the embedded default model's."""
    from vllm_lookahead.tools.models import MODELS, default_model_path, prepare

    if name is None:
        return default_model_path()
    return str(prepare(name)) if name in MODELS else name


# ------------------------------------------------------------------------------------------------- main side


def _step_ms(r: dict[str, float]) -> dict[str, float]:
    """One record's parts in ms; `drafting` = propose + begin_step; `rest` = step - the named parts."""
    g = {k: 1000 * v for k, v in r.items() if isinstance(v, float) and k != "scheduled"}
    step = g.get("execute", 0.0) + g.get("sample_tokens", 0.0)
    out = {
        "step": step,
        "forward": g.get("forward", 0.0),
        "stock_attn": g.get("stock_attn", 0.0),
        "tree_attn": g.get("tree_attn", 0.0),
        "logits": g.get("logits", 0.0),
        "sample_verify": g.get("sample_verify", 0.0),
        "kv_move": g.get("kv_move", 0.0),
        "drafting": g.get("propose", 0.0) + g.get("begin", 0.0),
    }
    out["rest"] = step - out["forward"] - out["logits"] - out["sample_verify"] - out["drafting"]
    return out


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median of each part per (dtype, kind, context, tokens)."""
    groups: dict[tuple[str, str, int, int], list[dict[str, float]]] = defaultdict(list)
    for res in results:
        for r in res["records"]:
            groups[(res["dtype"], res["kind"], r["context"], r["tokens"])].append(r)
    rows = []
    for (dtype, kind, ctx, tokens), recs in sorted(groups.items()):
        row: dict[str, Any] = {"dtype": dtype, "kind": kind, "context": ctx, "tokens": tokens, "n": len(recs)}
        # scheduled tokens per step: x0 + the tree (lookahead) or the new tokens (bare)
        row["scheduled"] = sum(r["scheduled"] for r in recs) / len(recs)
        parts = [_step_ms(r) for r in recs]
        for part in (*PARTS, "rest"):
            row[part] = _median([p[part] for p in parts])
        rows.append(row)
    bare = {(r["dtype"], r["context"], r["tokens"]): r for r in rows if r["kind"] == "bare"}
    for r in rows:
        b = bare.get((r["dtype"], r["context"], r["tokens"]))
        b1 = bare.get((r["dtype"], r["context"], 1))
        r["bare_step"] = b["step"] if b else None
        r["bare_step_1row"] = b["step"] - b["logits"] + b1["logits"] if b and b1 else None
        r["step_vs_bare_1row"] = r["step"] / r["bare_step_1row"] if r["bare_step_1row"] else None
        r["bare_forward"] = b["forward"] if b else None
        r["step_vs_bare"] = r["step"] / b["step"] if b else None
        r["forward_vs_bare"] = r["forward"] / b["forward"] if b else None
    return rows


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def markdown(rows: list[dict[str, Any]], dtype: str) -> str:
    head = (
        "| context | step | T | tokens/step | step ms | forward | stock attn | tree attn | logits | sample+verify "
        "| kv move | drafting | rest | bare(T) step | step / bare(T) | forward / bare(T) forward "
        "| bare(T), 1 row | step / bare(T), 1 row |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r["dtype"] != dtype:
            continue
        what = "plain (bare)" if r["kind"] == "bare" else "lookahead"

        cells = [str(r["context"]), what, str(r["tokens"]), f"{r['scheduled']:.1f}"]
        cells += [_ms(r[k]) for k in ("step", "forward", "stock_attn", "tree_attn", "logits", "sample_verify")]
        cells += [_ms(r[k]) for k in ("kv_move", "drafting", "rest", "bare_step")]
        cells += [_ratio(r["step_vs_bare"]), _ratio(r["forward_vs_bare"])]
        cells += [_ms(r["bare_step_1row"]), _ratio(r["step_vs_bare_1row"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _part(r: dict[str, Any], name: str) -> float:
    if name == "forward (other)":
        return r["forward"] - r["stock_attn"] - r["tree_attn"]
    return r[{"stock attn": "stock_attn", "tree attn": "tree_attn", "sample+verify": "sample_verify"}.get(name, name)]


def plot(rows: list[dict[str, Any]], dtype: str, path: Path, model: str = "default model") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = sorted({r["context"] for r in rows if r["dtype"] == dtype})
    fig, axes = plt.subplots(1, len(contexts), figsize=(5 * len(contexts), 4.5), sharey=True, squeeze=False)
    parts = [
        ("forward (other)", "#4c72b0"),
        ("stock attn", "#55a868"),
        ("tree attn", "#c44e52"),
        ("logits", "#dd8452"),
        ("sample+verify", "#8172b2"),
        ("drafting", "#ccb974"),
        ("rest", "#64b5cd"),
    ]
    for ax, ctx in zip(axes[0], contexts, strict=True):
        here = [r for r in rows if r["dtype"] == dtype and r["context"] == ctx]
        bare_by_t = {r["tokens"]: r for r in here if r["kind"] == "bare"}
        bars = ([bare_by_t[1]] if 1 in bare_by_t else []) + sorted(
            (r for r in here if r["kind"] != "bare"), key=lambda r: r["tokens"]
        )
        xs = list(range(len(bars)))
        bottom = [0.0] * len(bars)
        for name, color in parts:
            vals = [_part(r, name) for r in bars]
            ax.bar(xs, vals, bottom=bottom, color=color, label=name if ctx == contexts[0] else None)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        bare_line = [bare_by_t[r["tokens"]]["step"] if r["tokens"] in bare_by_t else float("nan") for r in bars]
        label = "plain step computing T tokens and T rows of logits (bare)" if ctx == contexts[0] else None
        ax.plot(xs, bare_line, "k--o", label=label)
        ax.set_xticks(xs, ["plain" if r["kind"] == "bare" else str(r["tokens"]) for r in bars])
        ax.set_xlabel("lookahead tree nodes T")
        ax.set_title(f"context {ctx}")
    axes[0][0].set_ylabel("ms per engine step (median)")
    fig.legend(loc="lower center", ncol=3, fontsize=8)
    fig.suptitle(f"Engine step breakdown, {dtype}, {model}, batch 1")
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_child(args: argparse.Namespace, kind: str, dtype: str) -> list[dict[str, Any]]:
    import subprocess

    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        rf = Path(tmp) / "r.json"
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--worker", f"{kind}:{dtype}"]
        cmd += ["--result-file", str(rf)]
        rc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr).returncode
        if rc == 0 and rf.exists():
            return json.loads(rf.read_text())
    print(f"warning: {kind} {dtype} failed (exit {rc})", file=sys.stderr)
    return []


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    from tqdm import tqdm

    if args.runtime == "project":
        os.environ.update(cpu_runtime.environment())
    tree_path = "reference" if os.environ.get("VLLM_LOOKAHEAD_TREE_KERNEL") == "0" else "kernel"
    trees = () if args.bare_only else tuple(f"tree={t}" for t in args.tree_list)
    kinds = list(trees) if args.paired else ["bare", *trees]  # paired: each tree's process times its bare steps
    jobs = [(k, d) for _ in range(args.rounds) for d in args.dtype_list for k in kinds]
    results = []
    for kind, dtype in tqdm(jobs, desc="configurations", file=sys.stderr):
        results += run_child(args, kind, dtype)
    rows = summarise(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"step_T{'-'.join(map(str, args.tree_list))}_ctx{'-'.join(map(str, args.context_list))}"
    stem += ("_vllm-runtime" if args.runtime == "vllm" else "") + ("_reference" if tree_path == "reference" else "")
    stem += f"_{Path(args.model).name}" if args.model else ""
    stem += "_bare" if args.bare_only else ""
    stem += "_paired" if args.paired else ""
    for dtype in args.dtype_list:
        print(f"\n### {dtype} (ms per engine step, medians; batch 1; tree attention: {tree_path}; "
              f"{cpu_runtime.describe({})})\n")  # fmt: skip
        print(markdown(rows, dtype))
        if not args.bare_only:  # the chart stacks lookahead steps against bare ones: nothing to draw without them
            png = out / f"{stem}_{dtype}.png"
            plot(rows, dtype, png, Path(args.model).name if args.model else "default model")
            print(f"\nchart: {png}")
    append_jsonl(out / f"{stem}.jsonl", vars(args) | {"worker": None}, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
