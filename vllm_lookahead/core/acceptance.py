"""How likely a tree node is to be accepted, learned from what the sequence did: the scores that decide which nodes
a step carries.

A node at depth d from source s is accepted, given that its parent was, with probability min(1, k[s, d] * c), where
c is the source's own estimate for that token (the suffix library's conditional probability; 1 for sources without
one) and k[s, d] is learned: accepted nodes / their summed estimates, over nodes whose parent was accepted. A node's
score is the product of these along its root path: the probability that it is accepted.

k is learned in hindsight over every node a tree held, not only the ones a step verified (`observe_continuation`,
fed by the state with the tokens that actually followed the tree's root): "accepted" means the sequence went
through the node, which for greedy requests is what verification would have said, and for sampled ones what the
target's own draws did. Learning only from verified nodes would never learn what the sizing left out: a deep
prompt-lookup node, priced low at first, was never carried and so never shown to be accepted (deep prompt-lookup
nodes are accepted at 0.85-0.97 given their parent in a calibration run, below).

The learned rates are averages over every node a tree held, and what a step carries is the best-scored of them,
with siblings from several sources competing for one continuation: on chat text the nodes steps carried scored
about 1.5x what was accepted of them, so the sizing took nodes worth less than they cost. `calibration` is the
accepted nodes of the trees steps carried over their summed scores (`observe_carried`); the sizing scales every
score by it (`sizing.choose_sizes`).

The Jacobi window is scored by what it yields: its slots are rarely accepted themselves, but the n-grams it finds
enter the pool. `window_value` is the pool tokens accepted per step that the window found, divided by the window
slots a step carried: what one slot has been worth (`observe_window`, from verified trees).
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_lookahead.core.tree import Source, StepTree

MAX_DEPTH = 64
# Pseudo-observations behind the prior rates: enough to keep early estimates sane, few enough to be forgotten fast.
PRIOR_WEIGHT = 20.0
# Each observation's weight decays by this factor per step: about a thousand steps of memory.
DECAY = 0.999
# Conditional acceptance of a depth-1 node before anything was observed; deeper, the chance of a miss shrinks by
# PRIOR_RISE per level (a draft that matched so far tends to go on matching: a calibration run without the
# score floor, HumanEval, float32, accepted given the parent at depths 1-4: short-match prompt lookup 0.13,
# 0.40, 0.65, 0.80; suffix 0.32, 0.74, 0.91, 0.93).
PRIOR_RATE = {
    Source.LOOKUP: 0.5,
    Source.POOL: 0.3,
    Source.JACOBI: 0.2,
    Source.SUFFIX: 1.0,
    Source.WINDOW: 0.05,
    Source.SHARED: 0.2,
    Source.LOOKUP_SHORT: 0.2,
    Source.RECYCLE: 1.0,  # its estimates are the rank's measured rate
    Source.SUFFIX_SHORT: 0.5,  # about half the library's estimate (suffix.SHORT_MATCH)
    Source.LOOKUP_LONG: 0.9,
}
# What the window yields: accepted nodes of these sources.
WINDOW_FOUND = (Source.JACOBI, Source.WINDOW)
PRIOR_RISE = 0.7
PRIOR_WINDOW_VALUE = 0.02
# The calibration's prior: before carried nodes say otherwise, a node is worth CALIBRATION_START of its score, as if
# nodes scoring CALIBRATION_PRIOR in all had been carried; it stays within CALIBRATION_RANGE (docs/results.md, "Tuned
# constants").
CALIBRATION_START = 0.6
CALIBRATION_PRIOR = 15.0
CALIBRATION_RANGE = (0.25, 1.25)


class AcceptanceStats:
    def __init__(self) -> None:
        n = len(Source)
        self._hits = [[0.0] * (MAX_DEPTH + 1) for _ in range(n)]
        self._expected = [[0.0] * (MAX_DEPTH + 1) for _ in range(n)]
        for s, rate in PRIOR_RATE.items():
            for d in range(1, MAX_DEPTH + 1):
                self._expected[s][d] = PRIOR_WEIGHT
                self._hits[s][d] = PRIOR_WEIGHT * (1.0 - (1.0 - rate) * PRIOR_RISE ** (d - 1))
        self._window_yield = PRIOR_WINDOW_VALUE * PRIOR_WEIGHT
        self._window_slots = PRIOR_WEIGHT
        # Decay without touching every entry per step: new observations weigh 1/DECAY more than the last ones.
        self._weight = 1.0
        self._max_factors: dict[tuple[Source, int], float] = {}
        self._carried_score = CALIBRATION_PRIOR
        self._carried_accepted = CALIBRATION_PRIOR * CALIBRATION_START

    def factor(self, source: Source, depth: int) -> float:
        d = min(depth, MAX_DEPTH)
        return self._hits[source][d] / self._expected[source][d]

    def max_factor(self, source: Source, depth: int = MAX_DEPTH) -> float:
        """The largest factor of a source at depths 1..depth (remembered until the next observation: every request
        of a step asks, for each of its sources)."""
        key = (source, depth)
        out = self._max_factors.get(key)
        if out is None:
            hits, expected = self._hits[source], self._expected[source]
            out = self._max_factors[key] = max(hits[d] / expected[d] for d in range(1, min(depth, MAX_DEPTH) + 1))
        return out

    def path_scores(self, source: Source, estimates: Sequence[float] | None, length: int) -> list[float]:
        """Scores of a candidate path's `length` tokens (depth 1..length), given the source's own conditional
        estimates per token (None: no estimate, 1 each)."""
        hits, expected = self._hits[source], self._expected[source]  # `factor`, inlined: every candidate, every step
        out, p = [], 1.0
        for d in range(1, length + 1):
            k = min(d, MAX_DEPTH)
            f = hits[k] / expected[k]
            if estimates is not None:
                f *= estimates[d - 1]
            p *= f if f < 1.0 else 1.0
            out.append(p)
        return out

    @property
    def window_value(self) -> float:
        return self._window_yield / self._window_slots

    @property
    def calibration(self) -> float:
        """Accepted nodes per unit of carried score, recently (within CALIBRATION_RANGE)."""
        lo, hi = CALIBRATION_RANGE
        return min(hi, max(lo, self._carried_accepted / self._carried_score))

    def observe_carried(self, tree: StepTree, accepted: Sequence[int]) -> None:
        """A tree as a step carried it (cut to its scheduled nodes) and the nodes verification accepted."""
        self._carried_score = self._carried_score * DECAY + sum(tree.scores[1:])
        self._carried_accepted = self._carried_accepted * DECAY + len(accepted)

    def observe(self, tree: StepTree, accepted: Sequence[int]) -> None:
        """One verified tree and its accepted nodes (root excluded): every child of an accepted node was tried."""
        self._observe_nodes(tree, {0, *accepted}, None)
        self.observe_window(tree, accepted)

    def observe_continuation(self, tree: StepTree, following: Sequence[int]) -> None:
        """Hindsight over a whole tree: `following` are the sequence's tokens after the tree's root x0 (as many as
        are known). A node counts as tried where the sequence went through its parent and its own position is
        known, and as accepted where the sequence went through it."""
        self.observe_followed(tree, tree.follow(following)[0], len(following))

    def observe_followed(self, tree: StepTree, on: set[int], known: int) -> None:
        """`observe_continuation` given `tree.follow`'s nodes for the `known` tokens that followed the root."""
        self._observe_nodes(tree, on, known)

    def _observe_nodes(self, tree: StepTree, taken: set[int], known: int | None) -> None:
        self._max_factors.clear()
        self._weight /= DECAY
        if self._weight > 1e6:
            self._rescale()
        w = self._weight
        sources, depths, estimates = tree.sources, tree.depths, tree.estimates
        for v in taken:  # the children of the nodes the sequence went through are the nodes it tried
            if known is not None and depths[v] >= known:
                continue  # their position is not known yet
            for u in tree.children(v):
                s, d = sources[u], min(depths[u], MAX_DEPTH)
                self._expected[s][d] += w * estimates[u]
                if u in taken:
                    self._hits[s][d] += w

    def observe_window(self, tree: StepTree, accepted: Sequence[int]) -> None:
        """What the window's slots in a verified tree yielded: its accepted nodes that the window had found."""
        window_slots = len(tree.window_node) - 1  # (0, 0) is the root
        if window_slots > 0:
            w = self._weight
            sources = tree.sources
            self._window_slots += w * window_slots
            self._window_yield += w * sum(1 for u in accepted if sources[u] in WINDOW_FOUND)

    def _rescale(self) -> None:
        f = 1.0 / self._weight
        for table in (self._hits, self._expected):
            for row in table:
                for d in range(len(row)):
                    row[d] *= f
        self._window_slots *= f
        self._window_yield *= f
        self._weight = 1.0
