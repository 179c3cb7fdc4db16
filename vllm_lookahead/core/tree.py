"""One decoding step as a token tree rooted at x0: verification candidates plus the Jacobi window.

Every in-step token attends to the cached prefix plus the chain of in-step tokens from x0 to itself, so the
whole step is a tree, its attention mask is "ancestors and self", and a node's position is pos(x0) + depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from vllm_lookahead.core.window import JacobiWindow


def window_slots_max(window_size: int, ngram_size: int) -> int:
    """Most window slots at any fill level: rows (k+1) times columns W + N-2-k, maximised over k = 0..N-2.

    Equals W * (N-1) (the steady-state size) whenever W >= N-2; smaller W makes warm-up windows bigger.
    The tree-size bound built on it is `LookaheadParams.max_tree_nodes`.
    """
    w, n = window_size, ngram_size
    return max((k + 1) * (w + n - 2 - k) for k in range(n - 1))


class Source(IntEnum):
    """Where a node came from (a merged node keeps the source with the highest conditional estimate there)."""

    ROOT = 0
    LOOKUP = 1  # prompt lookup: the continuation of an earlier occurrence of the last tokens (matching 3-7 of them)
    POOL = 2  # the n-gram pool: n-grams of the prompt and the output
    JACOBI = 3  # the n-gram pool: n-grams the Jacobi window found before the text showed them
    SUFFIX = 4  # suffix trees over the prompt, the output and earlier requests' outputs
    WINDOW = 5  # a Jacobi window slot
    SHARED = 6  # the n-gram pool shared by all requests (what earlier requests saw and found)
    # prompt lookup on a match of the last 1-2 tokens only: far less often right, so scored apart
    # (a calibration run, HumanEval, float32: first tokens accepted 0.13
    # against 0.88 for a 3-token match; lookup.SHORT_MATCH)
    LOOKUP_SHORT = 7
    RECYCLE = 8  # token recycling: the target's own top-k after each token, from earlier steps (recycle.py)
    # a suffix-tree speculation matched on the context's last 1-2 tokens only: the library's estimates run high
    # there and low on long matches, so scored apart (suffix.SHORT_MATCH)
    SUFFIX_SHORT = 9
    LOOKUP_LONG = 10  # prompt lookup whose occurrence matches 8 or more tokens of context: nearly always right


@dataclass(slots=True)
class Candidate:
    """A root path to verify: tokens after x0, each with its score, the estimated probability that the path up to
    and including it is accepted (so scores never grow along a path). (Not frozen: a frozen dataclass takes three
    times as long to make, and every step makes several per request.)"""

    tokens: Sequence[int]
    scores: Sequence[float]
    source: Source
    # the source's own conditional estimate per token (the suffix library's); None: it has none
    estimates: Sequence[float] | None = None


@dataclass
class StepTree:
    """Nodes in an order where every parent index is below its children's (so any prefix is a tree).

    tokens[u], parents[u] (-1 for the root, node 0 = x0) and depths[u] (position offset from x0).
    window_node maps a window slot (row, col) to its node ((0, 0) -> 0); candidate_nodes[j] lists the nodes of
    candidate j's tokens in order (shorter if the tree was truncated). With merging, several slots/candidates
    may map to one node: a node is identified by its root path, and the model's output there is the same.
    scores[u] estimates the probability that node u is accepted (1 for the root; never more than its parent's),
    sources[u] says which source gave its conditional estimate given the parent (the highest of those proposing u)
    and estimates[u] that source's own conditional estimate (1: none).
    """

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    window_node: dict[tuple[int, int], int] = field(default_factory=dict)
    candidate_nodes: list[list[int]] = field(default_factory=list)
    _children: list[list[int]] = field(default_factory=list, repr=False)
    scores: list[float] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    estimates: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.scores) != n:
            self.scores = [1.0] + [0.0] * (n - 1)
        if len(self.sources) != n:
            self.sources = [Source.ROOT] + [Source.POOL] * (n - 1)
        if len(self.estimates) != n:
            self.estimates = [1.0] * n
        if not self._children or len(self._children) != len(self.tokens):
            kids: list[list[int]] = [[] for _ in self.tokens]
            for u in range(1, len(self.parents)):
                kids[self.parents[u]].append(u)
            self._children = kids

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    def children(self, u: int) -> list[int]:
        """Children of u in ascending node order (not a copy, do not mutate)."""
        return self._children[u]

    @property
    def child_lists(self) -> list[list[int]]:
        """Every node's children in ascending order, indexed by node (not copies, do not mutate): for walks that
        visit many nodes, such as verification."""
        return self._children

    def path(self, u: int) -> list[int]:
        """Node indices from the root to u, both included."""
        out = []
        parents = self.parents
        while u >= 0:
            out.append(u)
            u = parents[u]
        out.reverse()
        return out

    def follow(self, tokens: Sequence[int]) -> tuple[set[int], bool]:
        """The nodes whose root path (after x0) spells a prefix of `tokens`, the root included; and whether that
        decides every node the continuation reaches: each such node is a leaf or its next token is known (in an
        unmerged tree several nodes can share a root path, so it is a set)."""
        on, frontier = {0}, [0]
        kids, toks = self._children, self.tokens
        for tok in tokens:
            frontier = [c for u in frontier for c in kids[u] if toks[c] == tok]
            if not frontier:
                return on, True
            on.update(frontier)
        return on, not any(kids[u] for u in frontier)

    @property
    def is_chain(self) -> bool:
        """Every node is the previous node's child: causal attention over the nodes is already the tree mask."""
        return self.prefix_is_chain(len(self.parents))

    def prefix_is_chain(self, k: int) -> bool:
        """Whether the first k nodes are a chain (`truncate(k).is_chain`, without building it)."""
        parents = self.parents
        return all(parents[u] == u - 1 for u in range(1, min(k, len(parents))))

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> StepTree:
        """A linear tree: tokens[0] is the root, each next token the previous one's child."""
        n = len(tokens)
        return cls(tokens=list(tokens), parents=list(range(-1, n - 1)), depths=list(range(n)))

    def ancestor_mask(self) -> torch.Tensor:
        """[n, n] bool: mask[u, v] iff v is u or an ancestor of u (node u attends node v). Parents come first, so
        each row is its parent's plus the diagonal: a numpy row copy per node (a tenth of the time of torch's
        indexing per tree level for a 24-node tree)."""
        parents = self.parents
        n = len(parents)
        mask = np.eye(n, dtype=bool)
        for u in range(1, n):
            mask[u, :u] = mask[parents[u], :u]
        return torch.from_numpy(mask)

    def window_output_nodes(self, last_row: int, num_cols: int) -> list[int | None]:
        """Node of each slot (last_row, i), None where cut off: where the window update reads argmax."""
        get = self.window_node.get
        return [get((last_row, i)) for i in range(num_cols)]

    def truncate(self, max_nodes: int) -> StepTree:
        """The first max_nodes nodes (a valid tree since parents precede children); maps keep survivors."""
        if max_nodes < 1:
            raise ValueError(f"lookahead: max_nodes must be >= 1 (got {max_nodes})")
        if max_nodes >= len(self.tokens):
            return self
        m = max_nodes
        return StepTree(
            tokens=self.tokens[:m],
            parents=self.parents[:m],
            depths=self.depths[:m],
            window_node={s: u for s, u in self.window_node.items() if u < m},
            candidate_nodes=[[u for u in nodes if u < m] for nodes in self.candidate_nodes],
            _children=[[c for c in kids if c < m] for kids in self._children[:m]],
            scores=self.scores[:m],
            sources=self.sources[:m],
            estimates=self.estimates[:m],
        )

    def best_chain(self) -> StepTree:
        """The chain from the root through each node's first child (in a tree ordered by score, the best): the
        path a linear speculation would verify. Maps keep the survivors."""
        keep = [0]
        kids = self._children
        while kids[keep[-1]]:
            keep.append(kids[keep[-1]][0])
        if len(keep) == len(self.tokens):
            return self
        new = {u: i for i, u in enumerate(keep)}
        return StepTree(
            tokens=[self.tokens[u] for u in keep],
            parents=list(range(-1, len(keep) - 1)),
            depths=[self.depths[u] for u in keep],
            window_node={s: new[u] for s, u in self.window_node.items() if u in new},
            candidate_nodes=[[new[u] for u in nodes if u in new] for nodes in self.candidate_nodes],
            scores=[self.scores[u] for u in keep],
            sources=[self.sources[u] for u in keep],
            estimates=[self.estimates[u] for u in keep],
        )

    def best_chain_scores(self) -> list[float]:
        """`best_chain().scores`, without making the chain."""
        kids, scores = self._children, self.scores
        u, out = 0, [scores[0]]
        while kids[u]:
            u = kids[u][0]
            out.append(scores[u])
        return out

    def by_score(self, max_nodes: int | None = None, above: float | None = None) -> StepTree:
        """The same tree with its nodes in descending score (ties: the current order), so that any prefix is the
        best-scored subtree of its size. Parents still precede children: a child never outscores its parent.
        Cut in the same pass to its first `max_nodes` nodes and, with `above`, to those scoring above it (the root
        always stays): `by_score().truncate(k)` without building the whole reordered tree first."""
        n = len(self.tokens)
        scores = self.scores
        # sort is stable, reversed too: equal scores keep their order
        order = sorted(range(n), key=scores.__getitem__, reverse=True)
        m = n if max_nodes is None else max(1, min(n, max_nodes))
        if above is not None:
            m = min(m, max(1, sum(1 for sc in scores if sc > above)))
        if m == n and order == list(range(n)):
            return self
        if m < n:
            order = order[:m]
        new = [m] * n  # nodes cut off map past the kept ones
        for i, u in enumerate(order):
            new[u] = i
        old_parents = self.parents
        parents = [-1 if u == 0 else new[old_parents[u]] for u in order]
        if any(p >= i for i, p in enumerate(parents)):
            raise ValueError("lookahead: a node outscores its parent; scores must not grow along a path")
        depths, tokens, sources, estimates = self.depths, self.tokens, self.sources, self.estimates
        return StepTree(
            tokens=[tokens[u] for u in order],
            parents=parents,
            depths=[depths[u] for u in order],
            window_node={s: new[u] for s, u in self.window_node.items() if new[u] < m},
            candidate_nodes=[[new[u] for u in nodes if new[u] < m] for nodes in self.candidate_nodes],
            scores=[scores[u] for u in order],
            sources=[sources[u] for u in order],
            estimates=[estimates[u] for u in order],
        )


def build_step_tree(
    x0: int,
    window: JacobiWindow | None,
    candidates: Sequence[Candidate | Sequence[int]],
    merge: bool = True,
    max_nodes: int | None = None,
    window_score: float = 0.0,
) -> StepTree:
    """Tree of one step: root x0, then every candidate's tokens, then every window slot except (0, 0).

    Node order: candidates first, in the given order, then the window column-major. If the tree is cut to a
    prefix (max_nodes or an engine budget) candidates survive longest and the window's leading columns next;
    `StepTree.by_score` reorders by score instead. A plain token list is an unscored pool candidate; window slots
    score `window_score` (never more than their parent). A candidate's node is scored as its parent's score times
    the candidate's conditional estimate there (its score over its previous token's); a node shared by several
    candidates keeps the highest conditional and that candidate's source. So a node under a parent that another
    candidate made likelier scores as likely as that parent allows, not as its own path's lower scores would say.

    merge=True shares nodes between identical root paths (a trie); merge=False keeps each candidate's chain
    and the window separate (the paper's layout) but they still share the root. The window's own slots
    always share their row-0 prefix, as the paper's mask prescribes. window=None builds candidates only.
    """
    tokens = [x0]
    parents = [-1]
    depths = [0]
    scores = [1.0]
    sources: list[int] = [Source.ROOT]
    estimates = [1.0]
    # A candidate node's probability of acceptance given its parent's; None: a window slot's absolute score.
    conds: list[float | None] = [1.0]
    kids: list[list[int]] = [[]]
    # Per-node token -> child, only for merging.
    kid_by_tok: list[dict[int, int]] = [{}]

    def add(parent: int, tok: int, score: float, source: int, estimate: float = 1.0, cond: float | None = None) -> int:
        if merge:
            v = kid_by_tok[parent].get(tok)
            if v is not None:
                scores[v] = max(scores[v], score)
                old = conds[v]
                if cond is not None and (old is None or cond > old):  # a candidate's estimate beats a slot's
                    conds[v], sources[v], estimates[v] = cond, source, estimate
                return v
        v = len(tokens)
        tokens.append(tok)
        parents.append(parent)
        depths.append(depths[parent] + 1)
        scores.append(score)
        sources.append(source)
        estimates.append(estimate)
        conds.append(cond)
        kids.append([])
        kids[parent].append(v)
        if merge:
            kid_by_tok.append({})
            kid_by_tok[parent][tok] = v
        return v

    candidate_nodes: list[list[int]] = []
    for cand in candidates:
        if not isinstance(cand, Candidate):
            cand = Candidate(cand, [0.0] * len(cand), Source.POOL)
        u = 0
        nodes = []
        ests = cand.estimates or [1.0] * len(cand.tokens)
        prev = 1.0
        for tok, score, est in zip(cand.tokens, cand.scores, ests, strict=True):
            u = add(u, tok, score, cand.source, est, cond=min(1.0, score / prev) if prev > 0 else 0.0)
            prev = score
            nodes.append(u)
        candidate_nodes.append(nodes)

    window_node: dict[tuple[int, int], int] = {(0, 0): 0}
    if window is not None:
        # With merge=False `add` always makes a new node, so the window stays apart from the candidates while
        # its slots still chain as the paper's mask says: (0, i) under (0, i-1), (r, i) under (r-1, i).
        rows = window.rows
        nrows, ncols = len(rows), len(rows[0])
        row0 = rows[0]
        top = 0  # node of (0, i)
        for i in range(ncols):
            if i:
                top = add(top, row0[i], window_score, Source.WINDOW)
                window_node[(0, i)] = top
            u = top
            for r in range(1, nrows):
                u = add(u, rows[r][i], window_score, Source.WINDOW)
                window_node[(r, i)] = u

    for u in range(1, len(tokens)):  # parents come first: each node's score from its parent's final one
        c, above = conds[u], scores[parents[u]]
        # max: never below a candidate's own path score (the same product, but for rounding); min: a slot never
        # outscores its parent
        scores[u] = max(scores[u], above * c) if c is not None else min(scores[u], above)
    tree = StepTree(tokens, parents, depths, window_node, candidate_nodes, kids, scores, sources, estimates)
    if max_nodes is not None:
        tree = tree.truncate(max_nodes)
    return tree
