"""Methods compared in interleaved runs: one live engine per method, the methods taking turns on each round's prompts.

    python benchmarks/bench_interleaved.py --eager --concurrency 16 --num-prompts 32 --max-tokens 96 \
        --range-ratio 0.5 --rounds 5 --methods none,suffix,lookahead

`bench_methods.py` starts a fresh engine per method and round, so that one round's methods run minutes apart, while
this shared 2-core machine's speed drifts by 20% and more over minutes (plain decoding's own tokens/s moved by up to
25% between the rounds of one run). Here each method's engine starts once, in a worker process of its own, and
stays up: every round, each set's methods run one after another on the same prompts, in an order rotated by one
each round, so that a round's ratios compare runs well under a minute apart. Between its turns a worker's processes
(its engine's among them) are stopped (SIGSTOP), so that the idle engines take no CPU from the one being timed, as
in a fresh process: idle, each took about 1% of one core, and the last one spun for a second after its turn.

Every round takes the next `--num-prompts` prompts of each set: methods that learn from earlier outputs (suffix
decoding, lookahead's suffix trees) then hold the earlier rounds' outputs of other prompts, as a server that has run
a while does, never the measured prompts' own. HumanEval's 164 problems bound --rounds x --num-prompts.

Prints per set and method the median over rounds of its tokens/s over plain decoding's in the same round (with the
lowest and highest), then per round which method was the fastest. The table's other columns are those of
`bench_methods.py`, from the median round, except tokens per forward, drafts a step and acceptance: pooled over all
rounds, which every method ran (`bench_methods.median_rows`). Saves a plot of every round's ratios and appends the
rows (each with all its rounds) to a JSONL file named after the settings.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bench_methods as bm  # the scripts run from benchmarks/, which is on sys.path
from _results import append_jsonl

HUMANEVAL_SIZE = 164


def parse_args(argv: list[str] | None = None) -> Any:
    args = bm.parse_args(argv, doc=__doc__)
    if "humaneval" in args.dataset_list and args.rounds * args.num_prompts > HUMANEVAL_SIZE:
        raise SystemExit(
            f"--rounds x --num-prompts is {args.rounds * args.num_prompts}: HumanEval has {HUMANEVAL_SIZE} prompts, "
            "and every round takes new ones"
        )
    return args


# ----------------------------------------------------------------------------------------------- worker side


def serve(args: Any) -> int:
    """A live worker: start the method's engine, write its start result to --result-file, then run one command a line
    from stdin ("ROUND DATASET": that round's prompts of the set, the result written to <result-file>.ROUND.DATASET)
    until stdin ends."""
    method = args.worker
    llm, result = bm.start_engine(method, args)
    _write(Path(args.result_file), result)
    if llm is None:
        return 0
    tokenizer = llm.get_tokenizer()
    while line := sys.stdin.readline():
        round_index, dataset = line.split()
        r = int(round_index)
        prompts = bm.load_prompts(dataset, (r + 1) * args.num_prompts, tokenizer)[r * args.num_prompts :]
        data = bm.measure(llm, method, dataset, prompts, args)
        _write(Path(f"{args.result_file}.{r}.{dataset}"), data)
    return 0


def _write(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all: the parent polls for the file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------- main side


class LiveWorker:
    """One method's worker process: started once, then asked for one (round, dataset) run at a time."""

    def __init__(self, method: str, argv: list[str], folder: Path, cmd: list[str] | None = None) -> None:
        self.method = method
        self.base = folder / f"{method}.json"
        script = [sys.executable, os.path.abspath(__file__), *argv]
        cmd = [*(cmd or script), "--worker", method, "--result-file", str(self.base)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.tail = bytearray()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()
        # the start's result (status, spec_config); `result` then follows the worker's state
        self.start = self._wait(self.base) or {"method": method, "status": "failed", "reason": self._died()}
        self.result = self.start
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Lets the worker's processes run again (they are stopped between turns)."""
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        """To the worker's process group: its engine's processes too (they inherit it; the worker leads its own)."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        while chunk := self.proc.stdout.read1(65536):
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
            self.tail.extend(chunk)
            del self.tail[:-4000]

    def _wait(self, path: Path) -> dict[str, Any] | None:
        while not path.exists():
            if self.proc.poll() is not None:
                return None
            time.sleep(0.1)
        return json.loads(path.read_text())

    def _died(self) -> str:
        rc = self.proc.wait()
        lines = [line for line in bytes(self.tail).decode(errors="replace").replace("\r", "\n").splitlines() if line]
        how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
        return f"worker {how}" + (f"; its last output: {lines[-1].strip()[:300]}" if lines else "")

    @property
    def live(self) -> bool:
        return self.result["status"] == "ok" and self.proc.poll() is None

    def run(self, round_index: int, dataset: str) -> dict[str, Any]:
        if not self.live:
            return {"status": "failed", "reason": self.result.get("reason", "worker not running")}
        assert self.proc.stdin is not None
        self.resume()
        self.proc.stdin.write(f"{round_index} {dataset}\n".encode())
        self.proc.stdin.flush()
        data = self._wait(Path(f"{self.base}.{round_index}.{dataset}"))
        self._signal(signal.SIGSTOP)
        if data is None:
            self.result = {**self.result, "status": "failed", "reason": self._died()}
            return {"status": "failed", "reason": self.result["reason"]}
        return data

    def close(self) -> None:
        self.resume()
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            pass
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._reader.join(timeout=10)


def fastest(rows: list[dict[str, Any]], datasets: list[str]) -> dict[str, str]:
    """Per dataset, the method with the most tokens/s in one round's rows."""
    out = {}
    for d in datasets:
        ok = [r for r in rows if r["dataset"] == d and r["status"] == "ok"]
        if ok:
            out[d] = max(ok, key=lambda r: r["tokens_per_s"])["method"]
    return out


def save_rounds_chart(rounds: list[list[dict[str, Any]]], args: Any, path: Path, title: str) -> bool:
    """Each method's tokens/s over plain decoding's, round by round, one panel per set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.dataset_list), figsize=(5.5 * len(args.dataset_list), 4.2), squeeze=False)
    drawn = False
    for ax, dataset in zip(axes[0], args.dataset_list, strict=True):
        for method in args.method_list:
            points = [
                (i + 1, r["vs_none"])
                for i, rows in enumerate(rounds)
                for r in rows
                if r["dataset"] == dataset and r["method"] == method and r.get("vs_none") is not None
            ]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=method)
                drawn = True
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(1, len(rounds) + 1))
        ax.set_xlabel("round")
        ax.set_ylabel("tokens/s relative to none in the round")
        ax.set_title(dataset)
    if not drawn:
        plt.close(fig)
        return False
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return serve(args)
    model = bm.model_path(args)
    runtime = bm.apply_runtime(args)
    # SIGTERM (e.g. `timeout`) ends through the finally below, which resumes and closes the stopped workers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rounds: list[list[dict[str, Any]]] = []
    winners: list[dict[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-interleaved-") as tmp:
        workers: dict[str, LiveWorker] = {}
        try:
            for method in args.method_list:  # one at a time: engines start faster alone
                print(f"=== starting {method} ===", file=sys.stderr)
                workers[method] = LiveWorker(method, argv, Path(tmp))
                start = workers[method].start
                if start["status"] != "ok":
                    print(f"{method}: {start['status']}: {start.get('reason', '')}")
            for r in range(args.rounds):
                datasets: dict[str, dict[str, Any]] = {m: {} for m in args.method_list}
                for dataset in args.dataset_list:
                    for method in bm.run_order(args.method_list, r):
                        print(f"=== {method}/{dataset} (round {r + 1} of {args.rounds}) ===", file=sys.stderr)
                        datasets[method][dataset] = workers[method].run(r, dataset)
                results = {
                    m: {**w.start, "datasets": datasets[m]} if w.start["status"] == "ok" else w.start
                    for m, w in workers.items()
                }
                for m, per_set in datasets.items():
                    for dataset, data in per_set.items():
                        if data["status"] != "ok" and workers[m].start["status"] == "ok":
                            print(f"{m}/{dataset}: {data['status']}: {data.get('reason', '')}")
                rows = bm.build_rows(args, results)
                rounds.append(rows)
                winners.append(fastest(rows, args.dataset_list))
        finally:
            for w in workers.values():  # all resumed first: a stopped worker would outlive an error in a close
                w.resume()
            for w in workers.values():
                try:
                    w.close()
                except Exception as e:  # the others still close
                    print(f"{w.method}: closing its worker failed: {e}", file=sys.stderr)
    rows = bm.median_rows(rounds)
    mode = "eager" if args.eager else "compiled"
    how = "greedy" if args.temperature == 0 else f"temperature {args.temperature:g}, top-p {args.top_p:g}"
    title = (
        f"{Path(model).name}, {args.dtype}, {mode}, {how}, concurrency {args.concurrency}, interleaved, "
        f"{args.rounds} rounds of {args.num_prompts} new prompts x {bm.tokens_label(args)};\n{runtime}"
    )
    print(f"\n{title}\n")
    print(bm.markdown_table(rows))
    print()
    for dataset in args.dataset_list:
        order = [w.get(dataset, "-") for w in winners]
        counts = {m: order.count(m) for m in args.method_list if m in order}
        print(f"{dataset}: fastest by round: {', '.join(order)} ({', '.join(f'{m} {n}' for m, n in counts.items())})")
    for row in rows:
        row["fastest_by_round"] = [w.get(row["dataset"]) for w in winners]
    out_dir = Path(args.out)
    stem = "interleaved_" + bm.run_stem(args).removeprefix("methods_") + f"_R{args.rounds}"
    png, jsonl = out_dir / f"{stem}.png", out_dir / f"{stem}.jsonl"
    if save_rounds_chart(rounds, args, png, title):
        print(f"\nchart: {png}")
    settings = {**bm.run_settings(args, model, runtime), "interleaved": True}
    append_jsonl(jsonl, settings, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
