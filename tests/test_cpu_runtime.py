"""The CPU runtime the project's commands run under: what it sets, and that it keeps what the user set."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllm_lookahead.tools import cpu_runtime


def test_cpu_lists_in_vllm_syntax():
    assert cpu_runtime._cpu_list([0, 1]) == "0-1"
    assert cpu_runtime._cpu_list([3]) == "3"
    assert cpu_runtime._cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_preloads_go_first_and_the_users_are_kept(monkeypatch):
    monkeypatch.setattr(cpu_runtime, "find_tcmalloc", lambda: "/x/libtcmalloc_minimal.so.4")
    monkeypatch.setattr(cpu_runtime, "find_iomp", lambda: "/venv/lib/libiomp5.so")
    env = cpu_runtime.environment({"LD_PRELOAD": "/user/lib.so"})
    assert env["LD_PRELOAD"] == "/x/libtcmalloc_minimal.so.4:/venv/lib/libiomp5.so:/user/lib.so"
    # already there: nothing to add
    assert "LD_PRELOAD" not in cpu_runtime.environment({"LD_PRELOAD": env["LD_PRELOAD"]})


def test_without_the_libraries_nothing_is_preloaded(monkeypatch):
    monkeypatch.setattr(cpu_runtime, "find_tcmalloc", lambda: None)
    monkeypatch.setattr(cpu_runtime, "find_iomp", lambda: None)
    assert "LD_PRELOAD" not in cpu_runtime.environment({})


@pytest.mark.parametrize(("cores", "expected"), [({0, 1}, "0-1"), ({2, 3, 4, 5}, "2-5"), (set(range(8)), None)])
def test_small_machines_bind_every_core_large_ones_keep_vllms_default(monkeypatch, cores, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cores)
    assert cpu_runtime.environment({}).get("VLLM_CPU_OMP_THREADS_BIND") == expected


def test_a_users_binding_is_not_replaced(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert "VLLM_CPU_OMP_THREADS_BIND" not in cpu_runtime.environment({"VLLM_CPU_OMP_THREADS_BIND": "nobind"})


def test_compiled_starts_use_the_cache_that_loads_unless_the_user_chose():
    assert cpu_runtime.environment({})["VLLM_USE_AOT_COMPILE"] == "0"
    assert "VLLM_USE_AOT_COMPILE" not in cpu_runtime.environment({"VLLM_USE_AOT_COMPILE": "1"})


def test_describe_names_the_runtime():
    line = cpu_runtime.describe(
        {"LD_PRELOAD": "/a/libtcmalloc_minimal.so.4:/b/libiomp5.so", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    )
    assert line == "preload: tcmalloc+iomp; threads bound: 0-1"


def test_run_starts_the_command_under_it():
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VLLM_CPU_OMP_THREADS_BIND")}
    code = "import os; print(os.environ.get('LD_PRELOAD', '')); print(os.environ.get('VLLM_CPU_OMP_THREADS_BIND'))"
    out = subprocess.run(
        [sys.executable, "-m", "vllm_lookahead.tools.cpu_runtime", "run", "--", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    expected = cpu_runtime.environment(env)
    assert out[0] == expected.get("LD_PRELOAD", "")
    assert out[1] == expected.get("VLLM_CPU_OMP_THREADS_BIND", "None")
