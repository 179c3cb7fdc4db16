"""Child processes of the benchmarks and tests (`from vllm_lookahead.devtools import server`); the plugin never
imports it.

- `spawn` starts a command in a process group of its own, so that it and every process it starts (a server's engine
  core and workers, an engine's helpers) are signalled together (`signal_group`: SIGSTOP / SIGCONT between turns)
  and stopped together (`stop`: SIGTERM to the leader, SIGKILL after a grace, then SIGKILL to what is left);
- `Server` is `vllm serve` on a free local port: started, waited for until `/health` answers, stopped;
- `stop_all` stops every group `spawn` started that is still running (a script's last `finally`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"

_LIVE: set[subprocess.Popen] = set()  # every group spawn started and stop has not stopped


class ServerError(RuntimeError):
    """A server exited before it was healthy, or was not healthy in time (the message has its log's last lines)."""


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: Path | None, lines: int = 40) -> str:
    if path is None:
        return "(no log)"
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM if its parent dies without cleaning up (SIGKILL, a crash).
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def spawn(
    cmd: Sequence[str],
    *,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    echo_command: bool = False,
    die_with_parent: bool = False,
    **popen: Any,
) -> subprocess.Popen:
    """CMD in a process group of its own. With `log_path`, its stdout and stderr go there (after the command line,
    with `echo_command`); otherwise `popen` says where (Popen's own keywords). With `die_with_parent`, it gets SIGTERM
    when this process dies."""
    if die_with_parent:
        popen["preexec_fn"] = _die_with_parent
    if log_path is None:
        proc = subprocess.Popen(list(cmd), env=env, start_new_session=True, **popen)
    else:
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            if echo_command:
                log.write(("$ " + " ".join(cmd) + "\n").encode())
                log.flush()
            proc = subprocess.Popen(
                list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, **popen
            )
    _LIVE.add(proc)
    return proc


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """SIG to the process group `spawn` started `proc` in (nothing if none of it is left)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen, grace_s: float = 30.0, gone_s: float = 0.0) -> None:
    """Stops `proc` and everything in its group: SIGCONT (a stopped process acts on nothing), SIGTERM to the leader
    (`vllm serve` shuts its engine down itself), SIGKILL to it after `grace_s`, then SIGKILL to the rest of the group;
    with `gone_s`, SIGKILL again until none of the group is left (at most that many seconds)."""
    signal_group(proc, signal.SIGCONT)
    try:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
    finally:
        deadline = time.monotonic() + gone_s
        while True:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        _LIVE.discard(proc)


def stop_all(grace_s: float = 10.0) -> None:
    for proc in list(_LIVE):
        stop(proc, grace_s)


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read().decode("utf-8", errors="replace")


def wait_healthy(
    proc: subprocess.Popen, base: str, timeout_s: float, log_path: Path | None = None, name: str = "vllm serve"
) -> None:
    """Returns once `base`/health answers 200; ServerError if `proc` exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise ServerError(
                f"{name} exited with code {proc.returncode} before answering /health; "
                f"log {log_path}, last lines:\n{log_tail(log_path)}"
            )
        try:
            if http_get(f"{base}/health", timeout=5)[0] == 200:
                return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise ServerError(
                f"{name} not healthy after {timeout_s:.0f} s; log {log_path}, last lines:\n{log_tail(log_path)}"
            )
        time.sleep(2)


class Server:
    """`vllm serve` on a free local port: `start` (or `with`) spawns it and waits until it is healthy, `stop` (or the
    end of the `with`) stops it and everything it started. `command(port)` gives its command line (a subclass may
    override `command()` instead); `launch` and `wait_healthy` are `start`'s two halves, for servers started at once."""

    def __init__(
        self,
        command: Callable[[int], list[str]] | None = None,
        log_path: Path | None = None,
        *,
        env: dict[str, str] | None = None,
        host: str = HOST,
        start_timeout_s: float = 600.0,
        name: str = "vllm serve",
        echo_command: bool = False,
        die_with_parent: bool = False,
    ) -> None:
        self._command = command
        self.log_path = log_path
        self.env = env
        self.host = host
        self.start_timeout_s = start_timeout_s
        self.name = name
        self.echo_command = echo_command
        self.die_with_parent = die_with_parent
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        assert self._command is not None, "give Server a command, or override command()"
        return self._command(self.port)

    def launch(self) -> Server:
        """Spawns the server on a free port and returns at once."""
        self.port = free_port(self.host)
        self.proc = spawn(
            self.command(),
            log_path=self.log_path,
            env=self.env,
            echo_command=self.echo_command,
            die_with_parent=self.die_with_parent,
        )
        return self

    def wait_healthy(self) -> None:
        assert self.proc is not None, "launch() first"
        wait_healthy(self.proc, self.base, self.start_timeout_s, self.log_path, self.name)

    def start(self, attempts: int = 3) -> Server:
        """Launches the server and waits until it is healthy; another port if the one chosen was taken meanwhile."""
        for attempt in range(attempts):
            self.launch()
            try:
                self.wait_healthy()
                return self
            except BaseException as e:
                self.stop()
                taken = isinstance(e, ServerError) and "address already in use" in log_tail(self.log_path, 200).lower()
                if attempt + 1 < attempts and taken:
                    continue
                raise
        raise AssertionError("unreachable")

    def stop(self, grace_s: float = 30.0) -> None:
        if self.proc is not None:
            stop(self.proc, grace_s)

    def pause(self) -> None:
        """Stops the server's processes (SIGSTOP to its group), so that an idle server takes no CPU."""
        if self.proc is not None and self.proc.poll() is None:
            signal_group(self.proc, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            signal_group(self.proc, signal.SIGCONT)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
