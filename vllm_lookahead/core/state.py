"""Per-sequence lookahead state: the candidate sources of one sequence, driven once per decoding step.

Step protocol (glue and reference decoder):
    state.catch_up(num_tokens, fetch)                  # optional: tokens emitted by steps without a tree
    tree = state.build_tree(x0)                        # x0: last accepted token, KV not yet computed
    ... one target forward over tree.tokens at positions pos(x0) + tree.depths, mask tree.ancestor_mask()
    accepted_nodes, tokens = greedy_verify(tree, argmax)  # or draw_verify(tree, draw)
    state.update(tree, argmax, tokens)  # argmax of the target at every node, even when sampling
    x0 = tokens[-1]  # == state.x0
    state.close()                                      # the sequence ended

The tree holds the prompt-lookup, pool, shared-pool, suffix-tree and token-recycling candidates and the Jacobi
window, every node scored by the shared `AcceptanceStats` (the estimated probability that it is accepted) and ordered
best first, so that cutting the tree to k nodes keeps its k best.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence

from vllm_lookahead.core.acceptance import AcceptanceStats
from vllm_lookahead.core.lookup import LOOKUP_SOURCES, LookupIndex
from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.core.pool import NGramPool
from vllm_lookahead.core.recycle import TokenRecycler
from vllm_lookahead.core.suffix import SuffixCandidates
from vllm_lookahead.core.tree import Candidate, Source, StepTree, build_step_tree
from vllm_lookahead.core.window import JacobiWindow


class LookaheadState:
    __slots__ = (
        "params",
        "merge",
        "stats",
        "suffix",
        "req_id",
        "pool",
        "window",
        "x0",
        "num_steps",
        "num_tokens",
        "tail",
        "lookup",
        "prompt_len",
        "seen",
        "recent",
        "shared",
        "unscored",
        "following",
        "following_from",
        "recycle",
    )

    def __init__(
        self,
        params: LookaheadParams,
        prompt_token_ids: Sequence[int],
        merge: bool = True,
        stats: AcceptanceStats | None = None,
        suffix: SuffixCandidates | None = None,
        req_id: Hashable = 0,
        shared: NGramPool | None = None,
        recycle: TokenRecycler | None = None,
    ) -> None:
        """`stats`, `suffix`, `shared` (the pool shared by all requests) and `recycle` (the target's top tokens
        after each token) are shared by an engine's sequences (fresh stats when not given; no such source when
        None); `req_id` names this sequence in `suffix`."""
        self.params = params
        self.merge = merge
        self.stats = stats if stats is not None else AcceptanceStats()
        self.suffix = suffix if params.suffix_candidates else None
        self.recycle = recycle if params.recycle_candidates else None
        self.req_id = req_id
        # A request with its own n-gram size cannot share n-grams of the server's size.
        same_n = shared is not None and shared.ngram_size == params.ngram_size
        self.shared = shared if params.shared_pool_keys and same_n else None
        self.pool = NGramPool(params.ngram_size, params.guess_set_size, max_keys=params.max_pool_keys)
        if params.pool_from_prompt:
            self.pool.seed_from_tokens(prompt_token_ids)
        # A fresh seeded RNG per sequence: the same request always starts from the same window.
        rng = random.Random(params.lookahead_seed)
        self.window = JacobiWindow.from_tokens(params.window_size, params.ngram_size, prompt_token_ids, rng)
        self.x0: int | None = None
        # The last N-1 tokens of the sequence, to form the n-grams that new output tokens complete.
        self.tail: list[int] = list(prompt_token_ids[-(params.ngram_size - 1) :])
        # The sequence's last tokens, the context the suffix trees are matched against.
        self.recent: list[int] = list(prompt_token_ids[-params.suffix_depth :])
        self.num_steps = 0
        self.num_tokens = 0
        self.lookup = LookupIndex(prompt_token_ids) if params.lookup_candidates else None
        self.prompt_len = len(prompt_token_ids)
        self.seen = self.prompt_len  # tokens of the sequence the sources have learned
        if self.suffix is not None:
            self.suffix.start(req_id, prompt_token_ids)
        # Trees whose nodes the sequence has not yet decided, each with the index of its first position (after x0),
        # and the sequence's tokens from index following_from on, which decide them (`_score_in_hindsight`).
        self.unscored: list[tuple[StepTree, int]] = []
        self.following: list[int] = []
        self.following_from = 0

    def build_tree(self, x0: int, max_nodes: int | None = None, min_score: float = 0.0) -> StepTree:
        """This step's tree, best-scored nodes first: root x0, the lookup, pool and suffix candidates and the
        window; at most max_nodes nodes (default and ceiling: params.max_tree_nodes). min_score > 0 leaves out every
        node scoring at or below it (the step's sizing would not take it: `sizing.score_floor`), and so the work of
        drafting it."""
        if self.seen == self.prompt_len:
            self._learn([x0])  # the prefill's token (later ones arrive through update/catch_up)
        self.x0 = x0
        self.window.set_x0(x0)
        p, stats = self.params, self.stats
        cands: list[Candidate] = []

        def add(tokens: Sequence[int], source: Source, estimates: Sequence[float] | None = None) -> None:
            cands.append(Candidate(tokens, stats.path_scores(source, estimates, len(tokens)), source, estimates))

        def worth(source: Source, depth: int) -> bool:
            """Can a node of this source within `depth` clear the bar? A node scores at most its conditional
            estimate (below a parent another source made certain), so a source none of whose estimates clears it
            adds nothing the sizing would take, whatever it merges with."""
            return min_score <= 0 or min(1.0, stats.max_factor(source, depth)) > min_score

        if self.lookup is not None and any(worth(s, p.lookup_len) for s in LOOKUP_SOURCES):
            for c in self.lookup.candidates(p.lookup_candidates, p.lookup_len):
                add(c.tokens, c.source, c.estimates)
        n1 = p.ngram_size - 1
        if worth(Source.POOL, n1) or worth(Source.JACOBI, n1):
            for value, by_window in self.pool.get_with_origin(x0):
                add(value, Source.JACOBI if by_window else Source.POOL)
        if self.shared is not None and worth(Source.SHARED, n1):
            for value in self.shared.get(x0)[: p.guess_set_size]:
                add(value, Source.SHARED)
        if self.suffix is not None and (
            worth(Source.SUFFIX, p.suffix_candidates) or worth(Source.SUFFIX_SHORT, p.suffix_candidates)
        ):
            for c in self.suffix.candidates(self.req_id, self.recent, p.suffix_candidates):
                add(c.tokens, c.source, c.estimates)
        if self.recycle is not None:  # its own floor test stands for worth(): no guess clears it, nothing drafted
            scale = stats.max_factor(Source.RECYCLE, p.recycle_candidates)
            for tokens, estimates in self.recycle.candidates(x0, p.recycle_candidates, min_score, scale):
                add(tokens, Source.RECYCLE, estimates)
        window = self.window if min_score <= 0 or stats.window_value > min_score else None
        if window is None and min_score > 0 and not any(c.scores and c.scores[0] > min_score for c in cands):
            # No first token clears the bar, and none below one can (a node scores at most its parent): the root
            # alone, without merging and sorting what would all be cut (at a large batch, most requests' steps).
            return StepTree([x0], [-1], [0], {(0, 0): 0}, [[] for _ in cands])
        tree = build_step_tree(x0, window, cands, merge=self.merge, window_score=stats.window_value)
        cap = p.max_tree_nodes if max_nodes is None else min(max_nodes, p.max_tree_nodes)
        # best first: the nodes above the bar are a prefix (the root's score is 1)
        tree = tree.by_score(cap, min_score if min_score > 0 else None)
        if tree.num_nodes > 1:  # the whole tree, however much of it a step verifies, is scored in hindsight
            if not self.unscored:
                self.following, self.following_from = [], self.seen
            self.unscored.append((tree, self.seen))
        return tree

    def update(
        self,
        tree: StepTree,
        argmax_per_node: Sequence[int],
        accepted_tokens: Sequence[int],
        top: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """Advance the window one position, feed its n-grams to the pool, learn the accepted tokens, and set x0 to
        the last new token. `top`: the target's top tokens at x0 and at each accepted node, best first (what token
        recycling learns; None: it learns nothing this step).

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
        if self.recycle is not None and top is not None:
            self.recycle.observe([tree.tokens[0], *accepted_tokens[:-1]], top, accepted_tokens)
        found = window.step(x0_new, outputs)
        self.pool.add_many(found, by_window=True)
        if self.shared is not None:
            self.shared.add_many(found, by_window=True)
        self._learn(accepted_tokens)
        self.x0 = x0_new
        self.num_steps += 1
        self.num_tokens += len(accepted_tokens)

    def catch_up(self, num_tokens: int, fetch: Callable[[int, int], list[int]]) -> None:
        """Learn the sequence up to its first num_tokens tokens (fetch(a, b) returns tokens a..b-1): steps that ran
        without a tree (no drafts scheduled) emitted tokens that update() never saw."""
        if self.seen < num_tokens:
            self._learn(fetch(self.seen, num_tokens))

    def close(self) -> None:
        """The sequence ended: score its trees as far as it went, release its suffix tree (its output stays a
        candidate for later sequences)."""
        for tree, start in self.unscored:
            self.stats.observe_continuation(tree, self.following[start - self.following_from :])
        self.unscored.clear()
        if self.suffix is not None:
            self.suffix.stop(self.req_id)

    def _score_in_hindsight(self) -> None:
        """Teach the acceptance statistics every tree node the sequence has now decided: the nodes it went through
        were accepted, their children it did not take were not, whether or not a step carried them."""
        base, following = self.following_from, self.following
        left = []
        for tree, start in self.unscored:
            after = following[start - base :]
            on, decided = tree.follow(after)
            if decided:
                self.stats.observe_followed(tree, on, len(after))
            else:
                left.append((tree, start))
        self.unscored = left
        if left:  # keep the tokens from the oldest waiting tree's first position on
            cut = left[0][1] - base
            if cut > 0:
                del following[:cut]
                self.following_from += cut
        else:
            following.clear()
            self.following_from = self.seen

    def _learn(self, new_tokens: Sequence[int]) -> None:
        """Every text source learns the sequence's next tokens."""
        new = [int(t) for t in new_tokens]
        self.seen += len(new)
        if self.unscored:
            self.following.extend(new)
            self._score_in_hindsight()
        if self.params.pool_from_output or self.shared is not None:
            n = self.params.ngram_size
            seq = self.tail + new
            start = max(len(self.tail), n - 1)
            ngrams = [(seq[j - n + 1], tuple(seq[j - n + 2 : j + 1])) for j in range(start, len(seq))]
            if self.params.pool_from_output:
                self.pool.add_many(ngrams)
            if self.shared is not None:
                self.shared.add_many(ngrams)
        self.tail = (self.tail + new)[-(self.params.ngram_size - 1) :]
        if self.lookup is not None:
            self.lookup.extend(new)
        if self.suffix is not None:
            self.recent = (self.recent + new)[-self.params.suffix_depth :]
            self.suffix.extend(self.req_id, new)
