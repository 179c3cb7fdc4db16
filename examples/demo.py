"""The main job: generate with vLLM + lookahead on the embedded default model, and with plain decoding on the same
prompts; print lookahead's text, both runs' tokens/s and tokens per target forward pass, and the ratio.

    make demo            # or: .venv/bin/python examples/demo.py [--dtype float32] [--no-plain]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import threading
import time
import warnings

# What vLLM 0.32 prints on its own that a reader of the demo cannot act on, dropped by exact message (vLLM's engine
# processes are spawned: they run this module's top level too, as __mp_main__, so these two filters hold there):
# - at import, before vLLM configures its logging: Triton without a CPU backend (the `dev` extra installs Triton for
#   the CUDA kernel's tests; vLLM on a CPU runs without it either way);
# - vLLM's Triton dispatcher reading `torch.distributed.reduce_op` while it scans the loaded modules.
logging.getLogger("vllm.triton_utils.importing").addFilter(
    lambda record: not record.getMessage().startswith("Triton is installed, but doesn't include CPU backend")
)
warnings.filterwarnings(
    "ignore", r"`torch\.distributed\.reduce_op` is deprecated", FutureWarning, r"vllm\.triton_utils\.dispatcher"
)
# - vLLM's CPU worker saying which NUMA policy it binds memory with: a C++ warning written to the stderr file, so it is
#   dropped from the engine processes' stderr by `quiet_stderr`.
QUIET_LINES = (re.compile(rb"^\[W\S+ \S+ utils\.cpp:\d+\] Warning: NUMA binding: Using \w+ policy for memory alloc"),)

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three uses of a hash map, one line each.",
    "Explain in two sentences what speculative decoding is.",
]


def tokens_per_forward(llm) -> float | None:
    """Output tokens / target forward passes, from vLLM's speculative-decoding counters."""
    counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    generated = counters.get("vllm:generation_tokens")
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens")
    if not generated or accepted is None:
        return None
    return generated / (generated - accepted)


@contextlib.contextmanager
def quiet_stderr(drop=QUIET_LINES):
    """Within: every line written to this process's stderr file, and so its children's, passes unless it matches
    `drop`. The multiprocessing resource tracker starts before, so that what it says at exit goes out (but for its
    cleanup notes)."""
    from multiprocessing import resource_tracker

    # vLLM's engine and worker processes register shared memory and semaphores with this tracker; when a worker is
    # stopped before it unlinks them (vLLM's shutdown does not wait for every one), the tracker cleans them up at exit
    # and says so: nothing a reader of the demo can act on, so that message alone is dropped (the tracker is a process
    # of its own: it reads its warning filters from the environment).
    quiet = "ignore:resource_tracker:UserWarning:multiprocessing.resource_tracker"
    os.environ["PYTHONWARNINGS"] = ",".join(w for w in (os.environ.get("PYTHONWARNINGS"), quiet) if w)
    resource_tracker.ensure_running()
    sys.stderr.flush()
    saved = os.dup(2)
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)

    def pump() -> None:
        with open(read, "rb", buffering=0) as lines:
            for line in lines:
                if not any(p.search(line) for p in drop):
                    os.write(saved, line)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe ends when the last engine process holding it has exited
        thread.join(timeout=10)
        os.close(saved)


def generate(model: str, dtype: str, max_tokens: int, spec: dict | None) -> tuple[list, float, float | None, str]:
    """One engine's outputs for PROMPTS (after a warm-up), the seconds they took, its tokens per forward, and which
    attention path lookahead ran ("" without lookahead). The engine is shut down before it returns."""
    import gc

    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        dtype=dtype,
        max_model_len=2048,
        seed=0,
        enforce_eager=True,
        speculative_config=spec,
        disable_log_stats=False,
        use_tqdm_on_load=False,
    )
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
        llm.chat(conversations[:1], params, use_tqdm=False)  # warm-up
        start = time.perf_counter()
        outputs = llm.chat(conversations, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        tpf = tokens_per_forward(llm) if spec else 1.0
        path = llm.collective_rpc("lookahead_stats")[0]["backend"] if spec else ""
    finally:
        # Its engine processes stop, and free what they share with this one, before the next engine starts.
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    return outputs, elapsed, tpf, path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--no-plain", action="store_true", help="lookahead alone, without the plain-decoding run")
    parser.add_argument("--config", default="{}", help="extra lookahead keys as JSON, e.g. '{\"window_size\": 6}'")
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # vLLM's start-up notes and warnings (Triton on a CPU build, its own defaults) are nothing a demo's user acts on;
    # VLLM_LOGGING_LEVEL=INFO shows them, and lookahead's own line saying which attention path it runs and why.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from vllm_lookahead.devtools.models import default_model_path

    model = args.model or default_model_path()
    spec = {"method": "lookahead", **json.loads(args.config)}
    runs = {}
    with quiet_stderr():
        if not args.no_plain:
            runs["plain decoding"] = generate(model, args.dtype, args.max_tokens, None)
        runs["lookahead"] = generate(model, args.dtype, args.max_tokens, spec)

    outputs = runs["lookahead"][0]
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        print(f"\n### {prompt}\n{out.outputs[0].text.strip()}")
    print(f"\n{len(PROMPTS)} prompts, greedy, {args.dtype}, up to {args.max_tokens} new tokens each:")
    speed = {}
    for name, (outs, elapsed, tpf, path) in runs.items():
        n = sum(len(o.outputs[0].token_ids) for o in outs)
        speed[name] = n / elapsed
        per = f"{tpf:.2f}" if tpf else "1.00"
        how = f", {per} tokens per forward" + (f" ({path} attention path)" if path else "")
        print(f"  {name:<15} {n:4d} tokens in {elapsed:6.2f} s: {speed[name]:6.1f} tokens/s{how}")
    if "plain decoding" in runs:
        same = sum(
            a.outputs[0].token_ids == b.outputs[0].token_ids
            for a, b in zip(runs["plain decoding"][0], outputs, strict=True)
        )
        note = "" if args.dtype == "float32" else f" (exact in float32; {args.dtype} rounds differently)"
        ratio = speed["lookahead"] / speed["plain decoding"]
        print(f"\nlookahead / plain decoding: {ratio:.2f}x tokens/s; outputs identical for {same}/{len(PROMPTS)}{note}")


if __name__ == "__main__":
    main()
