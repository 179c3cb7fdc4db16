"""Per-sequence lookahead state: the n-gram pool and the Jacobi window, driven once per decoding step.

Step protocol (glue and reference decoder):
    tree = state.build_tree(x0)                        # x0: last accepted token, KV not yet computed
    ... one target forward over tree.tokens at positions pos(x0) + tree.depths, mask tree.ancestor_mask()
    accepted_nodes, tokens = greedy_verify(tree, argmax)  # or sample_verify(tree, probs, generator)
    state.update(tree, argmax, tokens)  # argmax of the target at every node, even when sampling
    x0 = tokens[-1]  # == state.x0
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from vllm_lookahead.config import LookaheadParams
from vllm_lookahead.lookup import LookupIndex
from vllm_lookahead.pool import NGramPool
from vllm_lookahead.tree import StepTree, build_step_tree
from vllm_lookahead.window import JacobiWindow


class LookaheadState:
    __slots__ = ("params", "merge", "pool", "window", "x0", "num_steps", "num_tokens", "tail", "lookup", "prompt_len")

    def __init__(self, params: LookaheadParams, prompt_token_ids: Sequence[int], merge: bool = True) -> None:
        self.params = params
        self.merge = merge
        self.pool = NGramPool(params.ngram_size, params.guess_set_size, max_keys=params.max_pool_keys)
        if params.pool_from_prompt:
            self.pool.seed_from_tokens(prompt_token_ids)
        # A fresh seeded RNG per sequence: the same request always starts from the same window.
        rng = random.Random(params.lookahead_seed)
        self.window = JacobiWindow.from_tokens(params.window_size, params.ngram_size, prompt_token_ids, rng)
        self.x0: int | None = None
        # The last N-1 tokens of the sequence, to form the n-grams that new output tokens complete.
        self.tail: list[int] = list(prompt_token_ids[-(params.ngram_size - 1) :])
        self.num_steps = 0
        self.num_tokens = 0
        # Prompt lookup over prompt + output; x0 joins it at the first build_tree, accepted tokens at update.
        self.lookup = LookupIndex(prompt_token_ids) if params.lookup_candidates else None
        self.prompt_len = len(prompt_token_ids)

    def build_tree(self, x0: int, max_nodes: int | None = None) -> StepTree:
        """This step's tree: root x0, prompt-lookup candidates, the pool's candidates for x0 (most recent first),
        then the window; at most max_nodes nodes (default and ceiling: params.max_tree_nodes)."""
        if self.lookup is not None and len(self.lookup.tokens) == self.prompt_len:
            self.lookup.extend([x0])  # the first new token (later ones arrive through update/catch_up)
        self.x0 = x0
        self.window.set_x0(x0)
        candidates = self.pool.get(x0)
        if self.lookup is not None:
            candidates = self.lookup.candidates(self.params.lookup_candidates, self.params.lookup_len) + candidates
        cap = self.params.max_tree_nodes if max_nodes is None else min(max_nodes, self.params.max_tree_nodes)
        return build_step_tree(x0, self.window, candidates, merge=self.merge, max_nodes=cap)

    def update(self, tree: StepTree, argmax_per_node: Sequence[int], accepted_tokens: Sequence[int]) -> None:
        """Advance the window one position, feed its n-grams to the pool, and set x0 to the last new token.

        Only the argmax at the window's last-row nodes is read. A slot cut off by max_nodes has no output:
        the window keeps its old guess for that position instead (see JacobiWindow.step) and its column
        teaches the pool nothing, so a truncated step stays exact and only loses lookahead.
        """
        if not accepted_tokens:
            raise ValueError("lookahead: a step always yields at least one token")
        window = self.window
        outputs = [
            None if u is None else int(argmax_per_node[u])
            for u in tree.window_output_nodes(window.fill, window.num_cols)
        ]
        x0_new = int(accepted_tokens[-1])
        self.pool.add_many(window.step(x0_new, outputs))
        if self.params.pool_from_output:
            self._learn_output(accepted_tokens)
        if self.lookup is not None:
            self.lookup.extend(accepted_tokens)
        self.x0 = x0_new
        self.num_steps += 1
        self.num_tokens += len(accepted_tokens)

    def catch_up(self, num_tokens: int, fetch: Callable[[int, int], list[int]]) -> None:
        """Bring the lookup index to the sequence's first num_tokens tokens (fetch(a, b) returns tokens a..b-1).

        Steps that ran without a tree (no drafts scheduled) emitted tokens that update() never saw.
        """
        if self.lookup is not None and len(self.lookup.tokens) < num_tokens:
            self.lookup.extend(fetch(len(self.lookup.tokens), num_tokens))

    def _learn_output(self, new_tokens: Sequence[int]) -> None:
        n = self.params.ngram_size
        seq = self.tail + [int(t) for t in new_tokens]
        start = max(len(self.tail), n - 1)
        add = self.pool.add
        for j in range(start, len(seq)):
            add(seq[j - n + 1], tuple(seq[j - n + 2 : j + 1]))
        self.tail = seq[-(n - 1) :]

    @property
    def compression(self) -> float:
        """Tokens emitted per step so far (an upper bound on the speedup)."""
        return self.num_tokens / self.num_steps if self.num_steps else 0.0
