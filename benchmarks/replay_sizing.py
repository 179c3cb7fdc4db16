"""The tree sizing's projected speed-up on every machine the project has measured: the engine's own drafting and sizing
replayed on recorded greedy runs, each step charged by the machine's step-cost curve (`devtools/sizing_replay.py`).

    python benchmarks/replay_sizing.py                 # table, and benchmarks/results/sizing_replay.png
    python benchmarks/replay_sizing.py --curves h200   # the curves whose name holds a string

For each curve (`tests/fixtures/step_costs.json`), prompt set (`tests/fixtures/replay_sequences.json.gz`: chat and
code, SmolLM2-135M greedy float32) and concurrency (1 and 16 requests in flight): lookahead's tokens per second over
plain decoding's, the best fixed tree size's (in hindsight) and lookahead's over it, over the whole run and over the
first 20 steps of eight fresh engines. `--plugin` also charges lookahead's steps the plugin's own host work, as timed
on a 2-core CPU, the same seconds on every machine (plain decoding pays none). Tokens per forward and acceptance are
this model's; the curves are the machines'.
`tests/test_sizing_replay.py` asserts lookahead at least 0.98x the best of plain decoding and every fixed size there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
FIXED = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)
REQUESTS = {1: 8, 16: 24}
FIRST, ROTATIONS = 20, 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--curves", default="", help="only the curves whose name holds one of these (comma-separated)")
    p.add_argument(
        "--plugin",
        action="store_true",
        help="lookahead's steps also pay the plugin's own host work as timed on a 2-core CPU (sizing_replay.PLUGIN_*), "
        "and idle requests rest as in the engine",
    )
    p.add_argument("--out", type=Path, default=None, help="the plot (default benchmarks/results/sizing_replay.png)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.devtools.sizing_replay import SIZED, load_curves, load_sequences, replay

    args = parse_args(argv)
    wanted = [w for w in args.curves.split(",") if w]
    curves = [c for c in load_curves(FIXTURES / "step_costs.json") if not wanted or any(w in c.name for w in wanted)]
    sequences = load_sequences(FIXTURES / "replay_sequences.json.gz")
    params = LookaheadParams()
    cells = [(ds, conc) for ds in ("code", "chat") for conc in REQUESTS]
    rows = []
    progress = tqdm(total=len(cells) * (len(FIXED) + len(curves)), desc="replays", file=sys.stderr)
    for ds, conc in cells:
        pool = sequences[ds]
        n, step = REQUESTS[conc], len(pool) // ROTATIONS
        whole = pool[:n]
        rotations = [(pool[i * step :] + pool[: i * step])[:n] for i in range(ROTATIONS)]
        fixed = {}
        for k in FIXED:
            fixed[k] = (
                replay(whole, params, conc, k, plugin=args.plugin),
                [replay(r, params, conc, k, steps=FIRST, plugin=args.plugin) for r in rotations],
            )
            progress.update()
        for curve in curves:
            sized = (
                replay(whole, params, conc, SIZED, curve, plugin=args.plugin),
                [replay(r, params, conc, SIZED, curve, steps=FIRST, plugin=args.plugin) for r in rotations],
            )
            progress.update()
            row = {"curve": curve.name, "dataset": ds, "concurrency": conc}
            for label, pick in (("whole", lambda x: [x[0]]), ("first", lambda x: x[1])):
                rates = {k: _rate(pick(v), curve) for k, v in fixed.items()}
                best = max(rates, key=rates.get)
                ours = _rate(pick(sized), curve)
                row[f"{label}_vs_plain"], row[f"{label}_vs_best"] = ours / rates[0], ours / rates[best]
                row[f"{label}_best_k"], row[f"{label}_best_vs_plain"] = best, rates[best] / rates[0]
            row["tokens_per_forward"] = sum(sized[0].emitted) / sum(sized[0].requests)
            rows.append(row)
    progress.close()
    print(table(rows))
    name = "sizing_replay_plugin.png" if args.plugin else "sizing_replay.png"
    save_plot(rows, args.out or ROOT / "benchmarks" / "results" / name)
    return 0


def _rate(traces, curve) -> float:
    return sum(sum(t.emitted) for t in traces) / sum(sum(t.seconds(curve)) for t in traces)


def table(rows: list[dict]) -> str:
    head = ("| machine, dtype | prompts | requests | lookahead / plain | best fixed size / plain | lookahead / best | "
            "first 20 steps: lookahead / plain | best / plain | lookahead / best | tokens per forward |")  # fmt: skip
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r['curve']} | {r['dataset']} | {r['concurrency']} | {r['whole_vs_plain']:.2f}x | "
            f"{r['whole_best_vs_plain']:.2f}x (k={r['whole_best_k']}) | {r['whole_vs_best']:.3f} | "
            f"{r['first_vs_plain']:.2f}x | {r['first_best_vs_plain']:.2f}x (k={r['first_best_k']}) | "
            f"{r['first_vs_best']:.3f} | {r['tokens_per_forward']:.2f} |"
        )
    return "\n".join(lines)


def save_plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = list(dict.fromkeys(r["curve"] for r in rows))
    cells = list(dict.fromkeys((r["dataset"], r["concurrency"]) for r in rows))
    fig, axes = plt.subplots(1, len(cells), figsize=(4.2 * len(cells), 0.45 * len(curves) + 1.8), sharey=True)
    for ax, (ds, conc) in zip(axes, cells, strict=True):
        mine = {r["curve"]: r for r in rows if r["dataset"] == ds and r["concurrency"] == conc}
        y = range(len(curves))
        ax.barh([i + 0.2 for i in y], [mine[c]["whole_vs_plain"] for c in curves], 0.4, label="lookahead (sized)")
        ax.barh([i - 0.2 for i in y], [mine[c]["whole_best_vs_plain"] for c in curves], 0.4,
                label="best fixed tree size (hindsight)", alpha=0.6)  # fmt: skip
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_yticks(list(y), curves, fontsize=8)
        ax.set_xlabel("tokens/s over plain decoding")
        ax.set_title(f"{ds}, {conc} in flight")
        ax.grid(axis="x", alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("Projected speed-up per machine (replayed on recorded SmolLM2-135M runs; step costs measured)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"\nplot: {out}")


if __name__ == "__main__":
    sys.exit(main())
