"""What fetching a step's drafts from the worker costs the engine core, per speculative method.

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/draft_fetch.py --methods suffix,lookahead

vLLM 0.32's engine core asks the worker process for a step's drafts after the step (`EngineCore.post_step` ->
`take_draft_token_ids`): a second round trip per step besides the step's own. Lookahead's drafts come with the
step's model output instead (`patches/draft_transfer.py`). Each method runs a multiprocess engine (as `LLM` runs by
default) in a child process whose engine core times, from a `sitecustomize` this script writes to a temporary folder
on the child's PYTHONPATH, every `post_step` and every fetch of the drafts. Prints per method the steps, the mean ms
of `post_step`, and the fetches with their mean ms. The plugin carries no code for it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

MARK = "DRAFT_FETCH "
# Imported by every Python process of the child's tree; times the engine core's post_step and its fetch of drafts.
SITECUSTOMIZE = textwrap.dedent(
    """
    import atexit, builtins, json, sys, time

    _stats = {"post_step": [0, 0.0], "fetch": [0, 0.0]}

    def _timed(owner, name, key):
        orig = getattr(owner, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                _stats[key][0] += 1
                _stats[key][1] += time.perf_counter() - t

        setattr(owner, name, timed)

    def _install():
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor

        _timed(EngineCore, "post_step", "post_step")
        _timed(MultiprocExecutor, "take_draft_token_ids", "fetch")
        atexit.register(lambda: _stats["post_step"][0] and sys.stderr.write("MARK" + json.dumps(_stats) + "\\n"))

    _import = builtins.__import__

    def _hook(name, *args, **kwargs):
        module = _import(name, *args, **kwargs)
        if name == "vllm.v1.engine.core" and builtins.__import__ is _hook:
            builtins.__import__ = _import
            _install()
        return module

    builtins.__import__ = _hook
    """
).replace("MARK", MARK)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="suffix,lookahead", help="comma list of bench_methods.py's methods")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--dataset", default="sharegpt", choices=("humaneval", "sharegpt"))
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from bench_methods import METHODS  # the scripts run from benchmarks/, which is on sys.path

    args.method_list = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in args.method_list if m not in METHODS or METHODS[m] is None]
    if bad or not args.method_list:
        p.error(f"--methods: {bad or 'none given'}; choose speculative methods of bench_methods.py")
    if min(args.num_prompts, args.max_tokens, args.concurrency) < 1:
        p.error("--num-prompts, --max-tokens and --concurrency must be positive")
    return args


def worker(args: argparse.Namespace) -> int:
    """One multiprocess engine of the method generating the prompts (its engine core reports at exit)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from bench_methods import load_prompts, speculative_config
    from vllm import LLM, SamplingParams

    from vllm_lookahead.tools.models import default_model_path

    args.lookahead_config = None
    llm = LLM(
        model=default_model_path(),
        dtype=args.dtype,
        max_model_len=2048,
        max_num_seqs=args.concurrency,
        seed=0,
        enforce_eager=True,
        speculative_config=speculative_config(args.worker, args),
    )
    prompts = load_prompts(args.dataset, args.num_prompts, llm.get_tokenizer())
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.max_tokens), use_tqdm=False)
    return 0


def run(method: str, argv: list[str], folder: Path) -> dict | None:
    """The engine core's timings for one method, or None if its child did not report them."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--worker", method]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    found = [line[len(MARK) :] for line in done.stderr.splitlines() if line.startswith(MARK)]
    if not found:
        tail = [line for line in done.stderr.splitlines() if line.strip()][-3:]
        print(f"{method}: no timings (exit code {done.returncode}): {' / '.join(tail)}", file=sys.stderr)
        return None
    return json.loads(found[-1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    print(f"{args.dataset}, {args.dtype}, {args.concurrency} at a time, {args.num_prompts} prompts x {args.max_tokens}")
    print("\n| method | steps | post_step, ms | fetches of drafts | fetch, ms |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="draft-fetch-") as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(SITECUSTOMIZE)
        for method in args.method_list:
            stats = run(method, argv, Path(tmp))
            if stats is None:
                print(f"| {method} | failed | | | |")
                continue
            (steps, post), (fetches, fetch) = stats["post_step"], stats["fetch"]
            fetch_ms = f"{fetch / fetches * 1e3:.2f}" if fetches else "-"
            print(f"| {method} | {steps} | {post / steps * 1e3:.2f} | {fetches} | {fetch_ms} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
