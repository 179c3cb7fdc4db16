"""How well the node scores predict acceptance, and how many tokens per forward the drafted trees could give at most.

    python -m vllm_lookahead.tools.cpu_runtime run -- python benchmarks/tree_calibration.py --dataset sharegpt

One in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0, eager, greedy, one request at a time) generates
`--num-prompts` prompts of the set after a warm-up on another prompt of it. Every step's whole tree (everything the
sources drafted above the step's score floor, of which the step verified its best `size` nodes) is recorded, and
after the run each is compared with the tokens that actually followed its root (greedy: what verification of any
node would have said). Prints:

- per source and depth, the nodes whose parent the sequence went through: how many, how often the sequence went on
  through them ("accepted"), and the mean conditional score the tree gave them (score / parent's score). A well
  calibrated scorer has the two columns close;
- tokens per forward as run, and the ceiling of the same trees: every drafted node verified (what a free node would
  give), with their mean sizes. `--no-floor` drafts every candidate whatever its score (the ceiling of the sources).

The script wraps the engine's drafting hook from outside; the plugin carries no code for it.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

from _inprocess import add_common_args  # the scripts run from benchmarks/, which is on sys.path
from _inprocess import engine as in_process_engine
from _inprocess import prompts as set_prompts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, dtype="float32", dataset="humaneval", num_prompts=10, max_tokens=128)
    p.add_argument("--no-floor", action="store_true", help="draft every candidate, whatever its score")
    p.add_argument("--max-depth", type=int, default=6, help="deeper nodes are counted at this depth")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from vllm import SamplingParams

    from vllm_lookahead.core.tree import Source
    from vllm_lookahead.glue import engine

    record: dict[str, bool] = {"on": False}
    # (prompt, x0's index + 1, the tree as proposed (its best chain where the step took chains), nodes of it verified,
    # the whole tree the state built)
    trees: list[tuple[tuple[int, ...], int, object, int, object]] = []
    draft = engine.LookaheadEngine._draft

    def _draft(self, runner, sampled):  # noqa: ANN001, ANN202
        drafts = draft(self, runner, sampled)
        batch = runner.input_batch
        for i, req_id in enumerate(batch.req_ids):
            tree = self.pending.proposed.get(req_id) if self.pending is not None else None
            state = self.states.get(req_id)
            if tree is None or state is None or not record["on"]:
                continue
            start = int(batch.num_tokens_no_spec[i])
            whole = state.unscored[-1][0] if state.unscored and state.unscored[-1][1] == start else tree
            prompt = tuple(batch.token_ids_cpu[i, : int(batch.num_prompt_tokens[i])].tolist())
            trees.append((prompt, start, tree, len(drafts[i]) + 1, whole))
        return drafts

    engine.LookaheadEngine._draft = _draft
    if args.no_floor:
        engine.score_floor = lambda cost, requests: 0.0

    llm = in_process_engine(args, 1)
    prompts = set_prompts(llm, args.dataset, args.num_prompts + 1)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llm.generate(prompts[-1:], sp, use_tqdm=False)  # warm-up, outside the measured prompts
    record["on"] = True
    t0 = time.perf_counter()
    outs = [o for p in prompts[: args.num_prompts] for o in llm.generate([p], sp, use_tqdm=False)]
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    text = {tuple(o.prompt_token_ids): list(o.prompt_token_ids) + list(o.outputs[0].token_ids) for o in outs}

    tried: dict[tuple[str, int], list[float]] = collections.defaultdict(lambda: [0, 0, 0.0])
    run = ceiling = verified = drafted = 0
    steps = 0
    for prompt, start, proposed, size, tree in trees:
        seq = text.get(prompt)
        if seq is None:
            continue
        steps += 1
        following = seq[start:]
        run += sum(1 for u in proposed.follow(following)[0] if 0 < u < size)
        on, _ = tree.follow(following)
        ceiling += len(on) - 1
        verified += size - 1
        drafted += tree.num_nodes - 1
        for u in range(1, tree.num_nodes):
            p = tree.parents[u]
            if p in on and tree.depths[u] <= len(following):
                row = tried[(Source(tree.sources[u]).name.lower(), min(tree.depths[u], args.max_depth))]
                row[0] += 1
                row[1] += u in on
                row[2] += tree.scores[u] / tree.scores[p] if tree.scores[p] > 0 else 0.0
    steps = max(steps, 1)
    config = args.lookahead_config or "default settings"
    floor = ", no score floor" if args.no_floor else ""
    print(f"\n{args.dataset}, {args.dtype}, {config}{floor}: {tokens} tokens in {seconds:.1f} s "
          f"({tokens / seconds:.1f} tokens/s), {steps} steps with a tree\n")  # fmt: skip
    print("| source | depth | nodes tried | accepted | mean conditional score |")
    print("|---|---|---|---|---|")
    for (src, depth), (n, a, s) in sorted(tried.items()):
        deeper = "+" if depth == args.max_depth else ""
        print(f"| {src} | {depth}{deeper} | {n} | {a / n:.3f} | {s / n:.3f} |")
    print(f"\nper step with a tree: {verified / steps:.1f} nodes verified, {run / steps:.2f} accepted "
          f"({1 + run / steps:.2f} tokens per forward); all {drafted / steps:.1f} drafted nodes verified would "
          f"accept {ceiling / steps:.2f} ({1 + ceiling / steps:.2f} tokens per forward)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
