"""A bounded serving soak: `vllm serve` with lookahead on 127.0.0.1 under a mix of concurrent clients.

    python benchmarks/soak_serve.py                         # 5 minutes, 16 clients (the long run)
    python benchmarks/soak_serve.py --duration 30 --clients 10 --json report.json   # the short run `make test` does

Starts the server (the embedded default model, float32, eager, `--speculative-config '{"method": "lookahead"}'`,
`VLLM_SERVER_DEV_MODE=1` for `/collective_rpc`), then `--clients` threads send requests until `--duration` is up,
each client running through the mix in turn from its own start (every kind is sent within the first few seconds):
completions and chat, streaming and not, greedy and sampled, requests with their own lookahead settings and
opted-out ones, streams the client drops after a few chunks (deliberate aborts), and prompts that run into
`--max-model-len` (no `max_tokens`). Every few seconds it samples the engine process's RSS and the
worker's live lookahead states. At the end it waits for the server to go idle and reports: requests served per
kind, errors (anything but a 200 with a complete answer, aborts aside), lookahead states alive at the end, and the
engine's RSS after warm-up and at the end. Both engines run with oneDNN's primitive cache bounded
(`ONEDNN_PRIMITIVE_CACHE_CAPACITY`, `ONEDNN_CACHE_CAPACITY` unless the environment sets it) and, before the clients
start, prefill prompts of more distinct lengths than its and vLLM's per-layer caches of step sizes hold
(`CACHE_FILL_LENGTHS`), so that the growth measured is not those bounded caches filling up, and with TCMalloc
returning freed pages at once (`TCMALLOC_ENV`), so that RSS is live memory rather than the allocator's cache of
freed blocks. The same mix then runs on plain decoding (unless `--no-baseline`; its server starts with lookahead's
and waits idle), whose engine may grow under it by itself, so the bound is on lookahead's growth beyond plain
decoding's. Prints a table, saves a PNG (RSS and live states over time) and, with `--json`, the reports. Exits 1 if
errors > 0, live states at the end > 0 or lookahead's RSS grew by more than `--rss-bound-mb` beyond plain decoding's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_lookahead.devtools import server
from vllm_lookahead.devtools.bench import RESULTS

HOST = server.HOST
KINDS = (
    "completion",
    "completion-stream",
    "chat",
    "chat-stream",
    "sampled",
    "sampled-stream",
    "own-settings",
    "opt-out",
    "abort-mid-stream",
    "to-max-model-len",
)
ABORT_AFTER_CHUNKS = 3
BLOCK_SIZE = 128
# On CPU, vLLM's linear layers keep a oneDNN matmul primitive per distinct number of rows a step computes (32 sizes
# per layer, `create_onednn_mm(..., 32)`), and oneDNN's own process-wide cache keeps up to
# ONEDNN_PRIMITIVE_CACHE_CAPACITY primitives (default 1024): an engine's RSS grows with every new step size until
# both are full, about +325 MiB for the default model after some 260 sizes, a ceiling that lookahead, whose steps
# come in more sizes, nears sooner (`benchmarks/research/rss_by_step_size.py`). So that the soak
# measures growth beyond those bounded caches, both engines run with oneDNN's cache bounded to ONEDNN_CACHE_CAPACITY
# primitives (unless the environment sets it) and each first prefills one prompt of every length here (more sizes
# than the caches hold), before its clients start.
ONEDNN_CACHE_CAPACITY = 64
# TCMalloc (in LD_PRELOAD under `vllm_lookahead.tools.cpu_runtime`) keeps large freed blocks in its page heap and
# returns them to the system at its own pace, so RSS follows a step's biggest transient buffers for tens of seconds
# at a time.
# A lookahead step's logits (one float32 row of the vocabulary per tree node, 0.58 MiB per node for the default
# model, so 100 MiB for some 170 nodes across a batch) are such a buffer: one CI soak measured lookahead's RSS
# jumping by 100 MiB and back three times and ending on a high (+109 MiB beyond plain). With freed pages returned at
# once, RSS tracks live memory, which is what a leak would grow: both engines run so unless the environment says
# otherwise.
TCMALLOC_ENV = {"TCMALLOC_AGGRESSIVE_DECOMMIT": "true"}
# Twice the 32 sizes a layer keeps: both caches are full before the clients start (160 lengths took a minute a server).
CACHE_FILL_LENGTHS = range(2, 2 + 64)


@dataclass
class Report:
    config: str  # the speculative_config, or "none"
    duration_s: float
    clients: int
    served: dict[str, int] = field(default_factory=dict)
    aborted: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    live_states_end: int = -1
    # output tokens the engine's shared suffix tree holds at the end (None without it): part of the growth, by design
    suffix_cached_tokens_end: int | None = None
    rss_mb_warm: float = 0.0
    rss_mb_end: float = 0.0
    samples: list[dict[str, float]] = field(default_factory=list)  # time, rss_mb, live_states, served

    @property
    def growth_mb(self) -> float:
        return self.rss_mb_end - self.rss_mb_warm

    @property
    def tail_slope_mb_per_min(self) -> float:
        """RSS trend over the last third of the run (least-squares, MiB per minute): about 0 once memory levels."""
        tail = self.samples[len(self.samples) * 2 // 3 :]
        if len(tail) < 3:
            return float("nan")
        t = [s["t"] for s in tail]
        y = [s["rss_mb"] for s in tail]
        mt, my = sum(t) / len(t), sum(y) / len(y)
        var = sum((a - mt) ** 2 for a in t)
        return 60 * sum((a - mt) * (b - my) for a, b in zip(t, y, strict=True)) / var if var else float("nan")


def verdict(la: Report, plain: Report | None, bound_mb: float) -> tuple[bool, float]:
    """(ok, lookahead's RSS growth beyond plain decoding's, or its whole growth without a baseline)."""
    excess = la.growth_mb - (plain.growth_mb if plain is not None else 0.0)
    errors = la.errors + (plain.errors if plain is not None else 0)
    return errors == 0 and la.live_states_end == 0 and excess <= bound_mb, excess


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=300.0, help="seconds of traffic (after the server is up)")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (8-32 in the issue's terms)")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=48, help="max_tokens of ordinary requests")
    p.add_argument("--warmup", type=float, default=None, help="seconds before the RSS baseline (default: 1/4)")
    p.add_argument(
        "--rss-bound-mb", type=float, default=100.0, help="most RSS growth after warm-up beyond plain decoding's (MiB)"
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the plain-decoding run (bound the whole growth)")
    p.add_argument(
        "--lookahead-config", default='{"method": "lookahead"}', help="speculative_config; none: plain decoding"
    )
    p.add_argument("--kv-tokens", type=int, default=8192, help="the server's KV cache, in tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--out", default=RESULTS, help="folder for the PNG")
    args = p.parse_args(argv)
    if args.clients < 1 or args.duration <= 0:
        p.error("--clients and --duration must be positive")
    return args


def start_server(args: argparse.Namespace, config: str, log_path: Path) -> server.Server:
    """Launches `vllm serve` and returns at once; `soak` waits until it is healthy."""
    from vllm_lookahead.devtools.models import default_model_path

    def command(port: int) -> list[str]:
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", default_model_path(),
            "--host", HOST, "--port", str(port), "--dtype", "float32", "--enforce-eager", "--seed", str(args.seed),
            "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(max(8, args.clients)),
            # A KV cache the mix cycles through within the warm-up: its pages are touched on first use, which RSS
            # would otherwise show as growth for as long as unused blocks remain.
            "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks-override", str(-(-args.kv_tokens // BLOCK_SIZE)),
        ]  # fmt: skip
        if config != "none":
            cmd += ["--speculative-config", config]
        return cmd

    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "PYTHONUNBUFFERED": "1"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_CACHE_CAPACITY))
    for key, value in TCMALLOC_ENV.items():
        env.setdefault(key, value)
    return server.Server(command, log_path, env=env, start_timeout_s=600).launch()


def engine_rss_mb(proc: subprocess.Popen) -> float:
    """RSS of the server's engine-core process (it holds the worker, the model and the lookahead states)."""
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    rss = []
    for c in children:
        try:
            rss.append(c.memory_info().rss)
        except psutil.NoSuchProcess:
            continue
    return max(rss, default=0) / 2**20  # the engine core is by far the largest child


def worker_stats(base: str) -> list[dict[str, Any]]:
    """Each worker's `lookahead_stats` (none without lookahead)."""
    import requests

    r = requests.post(f"{base}/collective_rpc", json={"method": "lookahead_stats"}, timeout=60)
    r.raise_for_status()
    return [s for s in r.json()["results"] if s]


def live_states(base: str) -> int:
    return int(sum(s["live_states"] for s in worker_stats(base)))


class Client:
    """One client's loop: draw a kind, send it, check the answer."""

    def __init__(self, base: str, model: str, prompts: dict[str, list[str]], args: argparse.Namespace, seed: int):
        self.base, self.model, self.prompts, self.args = base, model, prompts, args
        self.rng = random.Random(seed)

    def body(self, kind: str) -> tuple[str, dict[str, Any], bool]:
        """(path, JSON body, stream) of one request of `kind`."""
        rng, mt = self.rng, self.args.max_tokens
        code = rng.choice(self.prompts["code"])
        chat = [{"role": "user", "content": rng.choice(self.prompts["chat"])}]
        greedy = {"temperature": 0.0, "max_tokens": mt}
        sampled = {"temperature": 0.8, "top_p": 0.95, "max_tokens": mt, "seed": rng.randrange(1 << 30)}
        if kind == "completion":
            return "/v1/completions", {"prompt": code, **greedy}, False
        if kind == "completion-stream":
            return "/v1/completions", {"prompt": code, **greedy}, True
        if kind == "chat":
            return "/v1/chat/completions", {"messages": chat, **greedy}, False
        if kind == "chat-stream":
            return "/v1/chat/completions", {"messages": chat, **greedy}, True
        if kind == "sampled":
            return "/v1/chat/completions", {"messages": chat, **sampled}, False
        if kind == "sampled-stream":
            return "/v1/completions", {"prompt": code, **sampled}, True
        if kind == "own-settings":
            own = json.dumps({"window_size": rng.randint(1, 4), "guess_set_size": rng.randint(0, 4)})
            return "/v1/completions", {"prompt": code, **greedy, "vllm_xargs": {"lookahead": own}}, rng.random() < 0.5
        if kind == "opt-out":
            return "/v1/completions", {"prompt": code, **greedy, "vllm_xargs": {"lookahead": False}}, False
        if kind == "abort-mid-stream":
            return "/v1/completions", {"prompt": code, **greedy, "max_tokens": 4 * mt}, True
        # to-max-model-len: a long prompt and no max_tokens, so the request ends at the context's end.
        return "/v1/completions", {"prompt": self.prompts["long"][0], "temperature": 0.0, "ignore_eos": True}, True

    def one(self, kind: str) -> str:
        """'ok', 'aborted' or an error description."""
        import requests

        path, body, stream = self.body(kind)
        body = {"model": self.model, **body, "stream": stream}
        with requests.post(f"{self.base}{path}", json=body, stream=stream, timeout=600) as r:
            if r.status_code != 200:
                return f"{kind}: HTTP {r.status_code}: {r.text[:200]}"
            if not stream:
                choice = r.json()["choices"][0]
                return "ok" if choice.get("finish_reason") in ("stop", "length") else f"{kind}: {choice}"
            chunks, finish = 0, None
            for raw in r.iter_lines():
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    if kind == "to-max-model-len" and finish != "length":
                        return f"{kind}: finished with {finish!r}, not 'length'"
                    return "ok" if finish in ("stop", "length") else f"{kind}: stream finished with {finish!r}"
                chunk = json.loads(data)
                if "error" in chunk:
                    return f"{kind}: {chunk['error']}"
                chunks += 1
                for c in chunk.get("choices") or ():
                    finish = c.get("finish_reason") or finish
                if kind == "abort-mid-stream" and chunks >= ABORT_AFTER_CHUNKS:
                    return "aborted"  # leaving the `with` closes the connection: the server aborts the request
            return f"{kind}: stream ended without [DONE]"


def fill_step_size_cache(base: str, model: str) -> None:
    """One prefill of each of CACHE_FILL_LENGTHS, one at a time (each its own step of that many tokens); every prompt
    starts with its own token, so that no prefix-cache hit shortens it."""
    import requests
    from tqdm import tqdm

    for n in tqdm(CACHE_FILL_LENGTHS, desc="filling vLLM's step-size cache", unit="prefill"):
        ids = [100 + (n * 7919 + j * 104729) % 30000 for j in range(n)]
        requests.post(
            f"{base}/v1/completions",
            json={"model": model, "prompt": ids, "max_tokens": 1, "vllm_xargs": {"lookahead": False}},
            timeout=120,
        ).raise_for_status()


def soak(args: argparse.Namespace, config: str, srv: server.Server) -> Report:
    """The mix against a launched server (stopped at the end)."""
    import requests
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from vllm_lookahead.devtools.models import default_model_path
    from vllm_lookahead.devtools.prompts import humaneval_prompts, sharegpt_prompts

    tok = AutoTokenizer.from_pretrained(default_model_path())
    long_ids = tok("\n".join(humaneval_prompts(40)))["input_ids"][: args.max_model_len - 3 * args.max_tokens // 2]
    prompts = {
        "code": humaneval_prompts(40),
        "chat": sharegpt_prompts(40, max_chars=600),
        "long": [tok.decode(long_ids)],
    }
    report = Report(config=config, duration_s=args.duration, clients=args.clients)
    proc, base = srv.proc, srv.base
    try:
        srv.wait_healthy()
        model = requests.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        fill_step_size_cache(base, model)
        served: Counter[str] = Counter()
        lock = threading.Lock()
        start = time.monotonic()
        stop_at = start + args.duration
        warm_at = start + (args.duration / 4 if args.warmup is None else args.warmup)

        def loop(i: int) -> None:
            client = Client(base, model, prompts, args, seed=args.seed * 1000 + i)
            sent = 0
            while time.monotonic() < stop_at:
                kind = KINDS[(i + sent) % len(KINDS)]  # each client runs through the mix from its own start
                sent += 1
                try:
                    result = client.one(kind)
                except Exception as e:  # noqa: BLE001 - a failed request is counted, the soak goes on
                    result = f"{kind}: {type(e).__name__}: {e}"
                with lock:
                    if result == "ok":
                        served[kind] += 1
                    elif result == "aborted":
                        report.aborted += 1
                    else:
                        report.errors += 1
                        if len(report.error_samples) < 10:
                            report.error_samples.append(result)

        threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(args.clients)]
        for t in threads:
            t.start()
        label = "plain" if config == "none" else "lookahead"
        with tqdm(total=int(args.duration), desc=f"soak ({label})", unit="s") as bar:
            while any(t.is_alive() for t in threads):
                now = time.monotonic()
                sample = {
                    "t": now - start,
                    "rss_mb": engine_rss_mb(proc),
                    "live_states": live_states(base),
                    "served": sum(served.values()),
                }
                report.samples.append(sample)
                if not report.rss_mb_warm and now >= warm_at:
                    report.rss_mb_warm = sample["rss_mb"]
                bar.n = min(int(now - start), int(args.duration))
                bar.set_postfix(served=sample["served"], errors=report.errors, states=sample["live_states"])
                bar.refresh()
                time.sleep(2.0)
        # One more (opted-out, so it makes no state of its own) request after the last client's: its steps carry the
        # ids of the requests that finished last, which the worker only learns at a following step.
        requests.post(
            f"{base}/v1/completions",
            json={"model": model, "prompt": "x", "max_tokens": 2, "vllm_xargs": {"lookahead": False}},
            timeout=120,
        ).raise_for_status()
        deadline = time.monotonic() + 30
        while (states := live_states(base)) and time.monotonic() < deadline:
            time.sleep(0.5)
        report.live_states_end = states
        held = [st["suffix_cached_tokens"] for st in worker_stats(base)]
        report.suffix_cached_tokens_end = max(held) if held else None
        report.rss_mb_end = engine_rss_mb(proc)
        if not report.rss_mb_warm:
            report.rss_mb_warm = report.samples[0]["rss_mb"] if report.samples else report.rss_mb_end
        report.served = dict(sorted(served.items()))
    finally:
        srv.stop(grace_s=60)
    return report


def _or_na(v: int | None) -> str:
    return "n/a" if v is None else str(v)


def table(la: Report, plain: Report | None, bound_mb: float) -> str:
    runs = [("lookahead", la)] + ([("plain decoding", plain)] if plain is not None else [])
    kinds = sorted(set(la.served) | set(plain.served if plain else ()))
    rows = [("requests served", [str(sum(r.served.values())) for _, r in runs])]
    rows += [(f"  {k}", [str(r.served.get(k, 0)) for _, r in runs]) for k in kinds]
    rows += [
        ("deliberate aborts", [str(r.aborted) for _, r in runs]),
        ("errors", [str(r.errors) for _, r in runs]),
        ("lookahead states alive at the end", [str(la.live_states_end)] + ["n/a"] * (len(runs) - 1)),
        ("tokens in the shared suffix tree at the end", [_or_na(r.suffix_cached_tokens_end) for _, r in runs]),
        ("engine RSS after warm-up (MiB)", [f"{r.rss_mb_warm:.0f}" for _, r in runs]),
        ("engine RSS at the end (MiB)", [f"{r.rss_mb_end:.0f}" for _, r in runs]),
        ("growth (MiB)", [f"{r.growth_mb:+.0f}" for _, r in runs]),
        ("RSS trend over the last third (MiB/min)", [f"{r.tail_slope_mb_per_min:+.1f}" for _, r in runs]),
    ]
    ok, excess = verdict(la, plain, bound_mb)
    head = ["what", *(name for name, _ in runs)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join([a, *b]) + " |" for a, b in rows]
    what = "beyond plain decoding's" if plain is not None else "in all"
    lines.append(f"\nlookahead's RSS growth {what}: {excess:+.0f} MiB (bound {bound_mb:.0f}); verdict: "
                 f"{'ok' if ok else 'FAILED'}")  # fmt: skip
    return "\n".join(lines)


def plot(la: Report, plain: Report | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, r in [("lookahead", la)] + ([("plain decoding", plain)] if plain is not None else []):
        t = [s["t"] for s in r.samples]
        axes[0].plot(t, [s["rss_mb"] for s in r.samples], marker=".", label=name)
        axes[1].plot(t, [s["served"] / max(1.0, s["t"]) for s in r.samples], label=f"requests/s, {name}")
    t = [s["t"] for s in la.samples]
    axes[1].plot(t, [s["live_states"] for s in la.samples], marker=".", label="live lookahead states")
    axes[0].set(xlabel="seconds", ylabel="engine RSS (MiB)", title="engine memory")
    axes[1].set(xlabel="seconds", title=f"{la.clients} clients")
    for ax in axes:
        ax.legend()
    fig.suptitle(f"vllm serve soak, {la.duration_s:.0f} s: lookahead served {sum(la.served.values())} requests, "
                 f"{la.errors} errors")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"soak_c{args.clients}_d{int(args.duration)}"
    # Both servers start at once (a start is mostly one core importing and loading); the plain one waits, idle,
    # until lookahead's soak is done.
    configs = {"lookahead": args.lookahead_config, **({} if args.no_baseline else {"plain": "none"})}
    logs = {k: out / f"{name}_{'plain_' if k == 'plain' else ''}server.log" for k in configs}
    servers: dict[str, server.Server] = {}
    try:
        for k, config in configs.items():
            servers[k] = start_server(args, config, logs[k])
        la = soak(args, configs["lookahead"], servers["lookahead"])
        plain = soak(args, "none", servers["plain"]) if "plain" in servers else None
    finally:
        for srv in servers.values():
            srv.stop(grace_s=60)
    print(table(la, plain, args.rss_bound_mb))
    for r in (la, plain):
        for e in r.error_samples if r is not None else ():
            print(f"error ({r.config}):", e)
    png = out / f"{name}.png"
    plot(la, plain, png)
    print(f"plot: {png}")
    ok, excess = verdict(la, plain, args.rss_bound_mb)
    if args.json:
        report = {
            "lookahead": {**asdict(la), "tail_slope_mb_per_min": la.tail_slope_mb_per_min},
            "plain": {**asdict(plain), "tail_slope_mb_per_min": plain.tail_slope_mb_per_min} if plain else None,
            "excess_growth_mb": excess,
            "rss_bound_mb": args.rss_bound_mb,
            "ok": ok,
        }
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
