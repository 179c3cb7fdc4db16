import itertools
import math
import random
from collections import Counter, defaultdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.core.tree import StepTree, build_step_tree
from vllm_lookahead.core.verify import draw_verify, greedy_verify
from vllm_lookahead.core.window import JacobiWindow
from vllm_lookahead.devtools import rejection_sampling
from vllm_lookahead.devtools.rejection_sampling import sample_verify


# ---------------------------------------------------------------------------------------------- helpers
@st.composite
def random_trees(draw, vocab=4, max_nodes=12):
    """Arbitrary trees in parents-first order, duplicate sibling tokens allowed (unmerged-style)."""
    n = draw(st.integers(1, max_nodes))
    parents = [-1] + [draw(st.integers(0, u - 1)) for u in range(1, n)]
    tokens = [draw(st.integers(0, vocab - 1)) for _ in range(n)]
    depths = [0]
    for u in range(1, n):
        depths.append(depths[parents[u]] + 1)
    return StepTree(tokens=tokens, parents=parents, depths=depths)


@st.composite
def step_trees(draw, vocab=4, max_depth=3):
    """Trees as the engine builds them: candidates + a small window, merged or not."""
    tok = st.integers(0, vocab - 1)
    x0 = draw(tok)
    win = None
    if draw(st.booleans()):
        w = draw(st.integers(1, 2))
        n = draw(st.integers(2, 3))
        win = JacobiWindow(w, n, draw(st.lists(tok, min_size=w + n - 3, max_size=w + n - 3)), x0=x0)
        if draw(st.booleans()):
            win.step(x0, draw(st.lists(tok, min_size=win.num_cols, max_size=win.num_cols)))
            win.set_x0(x0)
    cands = draw(st.lists(st.lists(tok, min_size=1, max_size=max_depth), max_size=4))
    return build_step_tree(x0, win, cands, merge=draw(st.booleans()))


def _root_paths(tree):
    return [tree.path(u) for u in range(tree.num_nodes)]


def _brute_force_greedy(tree, argmax):
    best = None
    for path in _root_paths(tree):
        if all(tree.tokens[path[j + 1]] == argmax[path[j]] for j in range(len(path) - 1)):
            key = (-len(path), path)  # longest, then lowest node indices
            if best is None or key < best:
                best = key
    nodes = best[1][1:]
    return nodes, [tree.tokens[u] for u in nodes] + [argmax[nodes[-1] if nodes else 0]]


class Target:
    """A random autoregressive target over a tiny vocabulary: context tuple -> distribution, some zeros."""

    def __init__(self, seed, vocab):
        self.rng = random.Random(seed)
        self.vocab = vocab
        self.table = {}

    def __call__(self, ctx):
        ctx = tuple(ctx)
        if ctx not in self.table:
            w = [self.rng.random() if self.rng.random() < 0.75 else 0.0 for _ in range(self.vocab)]
            if sum(w) == 0:
                w[self.rng.randrange(self.vocab)] = 1.0
            s = sum(w)
            self.table[ctx] = [x / s for x in w]
        return self.table[ctx]


def _node_probs(tree, target):
    # The distribution at a node is the target's given the node's root path (root token included).
    return [target([tree.tokens[v] for v in tree.path(u)]) for u in range(tree.num_nodes)]


def exact_step_distribution(tree, probs):
    """Output distribution of one sample_verify step, by following the specified acceptance probabilities.

    probs[u] may be unnormalised; children are tried in node order, one trial per distinct token.
    """
    out = defaultdict(float)

    def rec(u, prefix, pr):
        q = list(probs[u])
        mass = sum(q)
        tried = set()
        for c in tree.children(u):
            t = tree.tokens[c]
            if t in tried:
                continue
            tried.add(t)
            a = q[t] / mass
            if a > 0:
                rec(c, prefix + (t,), pr * a)
            pr *= 1 - a
            mass -= q[t]
            q[t] = 0.0
            if pr <= 0 or mass <= 1e-15:
                return
        for x, qx in enumerate(q):
            if qx > 0:
                out[prefix + (x,)] += pr * qx / mass

    rec(0, (), 1.0)
    return dict(out)


def _extend_to(dist, target, root, length):
    """Output of a step, continued autoregressively to `length` tokens: distribution over length-tuples."""
    full = defaultdict(float)
    for seq, pr in dist.items():
        stack = [(seq, pr)]
        while stack:
            s, p = stack.pop()
            if len(s) >= length:
                full[s[:length]] += p
                continue
            for x, px in enumerate(target((root, *s))):
                if px > 0:
                    stack.append((s + (x,), p * px))
    return full


def _autoregressive(target, root, length, vocab):
    out = {}
    for y in itertools.product(range(vocab), repeat=length):
        p = 1.0
        for j in range(length):
            p *= target((root, *y[:j]))[y[j]]
        if p > 0:
            out[y] = p
    return out


def assert_step_is_autoregressive(dist, tree, target, vocab):
    """One step's output distribution, continued autoregressively to the tree's depth + 1 tokens, equals
    autoregressive sampling from the target over that many tokens."""
    assert math.isclose(sum(dist.values()), 1.0, abs_tol=1e-12)
    length = max(tree.depths) + 1
    got = _extend_to(dist, target, tree.tokens[0], length)
    want = _autoregressive(target, tree.tokens[0], length, vocab)
    assert set(got) <= set(want)
    for y, p in want.items():
        assert math.isclose(got.get(y, 0.0), p, abs_tol=1e-12), y


def _chi2_critical(df, z=5.0):
    # Wilson-Hilferty approximation of the chi-square quantile at a ~3e-7 upper tail: generous on purpose.
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


# ---------------------------------------------------------------------------------------------- greedy
def test_greedy_small_example():
    tree = build_step_tree(0, None, [[1, 2, 3], [1, 4]])  # nodes: 0:0, 1:1, 2:2, 3:3, 4:4
    argmax = [1, 4, 9, 9, 7]
    assert greedy_verify(tree, argmax) == ([1, 4], [1, 4, 7])
    assert greedy_verify(tree, [5, 0, 0, 0, 0]) == ([], [5])  # nothing matches: just the target's token
    assert greedy_verify(tree, [1, 2, 3, 8, 0]) == ([1, 2, 3], [1, 2, 3, 8])  # full candidate + bonus
    assert greedy_verify(tree, torch.tensor([1, 2, 3, 8, 0])) == ([1, 2, 3], [1, 2, 3, 8])


def test_greedy_unmerged_takes_longest_not_first_match():
    # Two children with token 1: the first leads nowhere, the second matches further.
    tree = StepTree(tokens=[0, 1, 1, 5], parents=[-1, 0, 0, 2], depths=[0, 1, 1, 2])
    assert greedy_verify(tree, [1, 5, 5, 6]) == ([2, 3], [1, 5, 6])
    assert greedy_verify(tree, [1, 7, 7, 6]) == ([1], [1, 7])  # tie: lowest index


@settings(max_examples=400, deadline=None)
@given(tree=random_trees(), data=st.data())
def test_greedy_matches_brute_force_arbitrary_trees(tree, data):
    argmax = data.draw(st.lists(st.integers(0, 3), min_size=tree.num_nodes, max_size=tree.num_nodes))
    assert greedy_verify(tree, argmax) == _brute_force_greedy(tree, argmax)


@settings(max_examples=200, deadline=None)
@given(tree=step_trees(), seed=st.integers(0, 10**6))
def test_greedy_matches_brute_force_consistent_target(tree, seed):
    # argmax as a real model gives it: a function of the root path.
    rng = random.Random(seed)
    table = {}
    argmax = []
    for u in range(tree.num_nodes):
        key = tuple(tree.tokens[v] for v in tree.path(u))
        argmax.append(table.setdefault(key, rng.randrange(4)))
    nodes, toks = greedy_verify(tree, argmax)
    assert (nodes, toks) == _brute_force_greedy(tree, argmax)
    assert 1 <= len(toks) <= max(tree.depths) + 1


# ---------------------------------------------------------------------------------------------- sampling
@settings(max_examples=300, deadline=None)
@given(tree=step_trees(), seed=st.integers(0, 10**6))
def test_exact_step_distribution_is_autoregressive(tree, seed):
    # The specified algorithm, followed exactly, reproduces autoregressive sampling from the target.
    vocab = 4
    target = Target(seed, vocab)
    probs = _node_probs(tree, target)
    assert_step_is_autoregressive(exact_step_distribution(tree, probs), tree, target, vocab)


def _fixed_case(merge):
    # Root distribution puts zero mass on token 4: the candidate [4, 0] must never be accepted.
    # [1, 2] appears twice (merged away when merge=True); [1, 3] shares the first token.
    target = Target(7, 5)
    target.table[(0,)] = [0.3, 0.25, 0.15, 0.3, 0.0]
    cands = [[1, 2], [1, 3], [1, 2], [4, 0], [2, 1, 1], [3]]
    win = JacobiWindow(2, 3, [3, 1], x0=0)
    tree = build_step_tree(0, win, cands, merge=merge)
    probs = _node_probs(tree, target)
    return tree, probs, target


@pytest.mark.parametrize("merge", [True, False])
def test_sample_verify_matches_exact_distribution(merge):
    tree, probs, target = _fixed_case(merge)
    # Scale rows: the implementation must not assume normalised probabilities.
    scale = [1.0 + 0.5 * (u % 3) for u in range(tree.num_nodes)]
    probs_t = torch.tensor([[p * s for p in row] for row, s in zip(probs, scale, strict=True)])
    dist = exact_step_distribution(tree, probs)

    gen = torch.Generator().manual_seed(1234)
    trials = 12000
    counts = Counter()
    zero_node = tree.candidate_nodes[3][0]
    for _ in range(trials):
        nodes, toks = sample_verify(tree, probs_t, gen)
        assert zero_node not in nodes
        assert toks[: len(nodes)] == [tree.tokens[u] for u in nodes]
        if nodes:
            assert tree.path(nodes[-1])[1:] == nodes
        counts[tuple(toks)] += 1
    assert set(counts) <= set(dist)
    chi2 = sum((counts.get(s, 0) - trials * p) ** 2 / (trials * p) for s, p in dist.items())
    assert chi2 < _chi2_critical(len(dist) - 1), chi2
    # Sanity of the check itself: the first-token marginal equals the root distribution.
    first = Counter()
    for s, c in counts.items():
        first[s[0]] += c
    for x, p in enumerate(target((0,))):
        assert abs(first[x] / trials - p) < 5 * math.sqrt(p * (1 - p) / trials) + 1e-9
    assert first[4] == 0


def test_sample_verify_extended_matches_autoregressive_by_sampling():
    # End to end with the real implementation: step output continued autoregressively vs pure sampling.
    tree, probs, target = _fixed_case(True)
    probs_t = torch.tensor(probs)
    length = max(tree.depths) + 1
    want = _autoregressive(target, 0, length, 5)
    rng = random.Random(5)
    gen = torch.Generator().manual_seed(99)
    trials = 12000
    counts = Counter()
    for _ in range(trials):
        _, toks = sample_verify(tree, probs_t, gen)
        seq = tuple(toks)
        while len(seq) < length:
            dist = target((0, *seq))
            seq += (rng.choices(range(5), weights=dist)[0],)
        counts[seq[:length]] += 1
    assert set(counts) <= set(want)
    # Pool the rare outcomes so the chi-square approximation holds.
    common = {y: p for y, p in want.items() if trials * p >= 5}
    rare_p = 1 - sum(common.values())
    rare_n = trials - sum(counts.get(y, 0) for y in common)
    chi2 = sum((counts.get(y, 0) - trials * p) ** 2 / (trials * p) for y, p in common.items())
    if trials * rare_p >= 5:
        chi2 += (rare_n - trials * rare_p) ** 2 / (trials * rare_p)
    assert chi2 < _chi2_critical(len(common)), chi2


@settings(max_examples=150, deadline=None)
@given(tree=step_trees(), seed=st.integers(0, 10**6))
def test_one_hot_sampling_equals_greedy(tree, seed):
    rng = random.Random(seed)
    table = {}
    argmax = []
    for u in range(tree.num_nodes):
        key = tuple(tree.tokens[v] for v in tree.path(u))
        argmax.append(table.setdefault(key, rng.randrange(4)))
    probs = torch.nn.functional.one_hot(torch.tensor(argmax), 4).double()
    gen = torch.Generator().manual_seed(seed)
    nodes, toks = sample_verify(tree, probs, gen)
    g_nodes, g_toks = greedy_verify(tree, argmax)
    merged = all(
        len({tree.tokens[c] for c in tree.children(u)}) == len(tree.children(u)) for u in range(tree.num_nodes)
    )
    if merged:
        assert (nodes, toks) == (g_nodes, g_toks)
    else:
        # Sampling follows the first matching child, greedy the longest match: both read the argmax chain.
        assert toks == g_toks[: len(toks)]


def test_sample_verify_seeded_reproducible_and_shape_checked():
    tree, probs, _ = _fixed_case(True)
    probs_t = torch.tensor(probs)
    runs = [[sample_verify(tree, probs_t, torch.Generator().manual_seed(s))[1] for s in range(40)] for _ in range(2)]
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in runs[0]}) > 1
    with pytest.raises(ValueError, match="probs must be"):
        sample_verify(tree, probs_t[:2], torch.Generator())


def test_sample_verify_root_only_and_float32():
    tree = build_step_tree(3, None, [])
    probs = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=torch.float32)
    assert sample_verify(tree, probs, torch.Generator().manual_seed(0)) == ([], [2])
    with pytest.raises(ValueError, match="no probability mass"):
        sample_verify(tree, torch.zeros(1, 4), torch.Generator())


def test_sample_row_inverse_cdf_never_picks_zero_mass():
    # Extreme uniforms (0 and the largest float64 below 1) must land on tokens that have mass.
    probs = torch.tensor([[0.0, 0.0, 0.7, 0.3, 0.0], [0.1, 0.0, 0.0, 0.0, 0.9]], dtype=torch.float64)
    for q in range(20):
        probs[0, 2] = 0.1 + q * 0.04
        assert rejection_sampling._sample_row(probs[0], 1.0 - 2.0**-53, None) in (2, 3)
        assert rejection_sampling._sample_row(probs[0], 0.0, None) == 2
    assert rejection_sampling._sample_row(probs[1], 0.0999, None) == 0
    assert rejection_sampling._sample_row(probs[1], 0.1001, None) == 4


def test_draw_verify_follows_the_targets_own_draws():
    # root 0 -> 1 (token 5) -> 3 (token 7); root -> 2 (token 6)
    tree = StepTree(tokens=[9, 5, 6, 7], parents=[-1, 0, 0, 1], depths=[0, 1, 1, 2])
    calls: list[int] = []

    def draws(values):
        it = iter(values)

        def draw(u: int) -> int:
            calls.append(u)
            return next(it)

        return draw

    assert draw_verify(tree, draws([5, 7, 4])) == ([1, 3], [5, 7, 4])
    assert calls == [0, 1, 3]  # one draw per output token, at the node reached
    calls.clear()
    assert draw_verify(tree, draws([6, 1])) == ([2], [6, 1])
    assert draw_verify(tree, draws([8])) == ([], [8])  # no child carries the draw: one token, as plain decoding


def test_draw_verify_output_is_the_draws_whatever_the_tree():
    # The output is the sequence of draws, cut where a draw is no child's token of the node reached, so its
    # distribution is the target's whatever the tree holds.
    tree = StepTree(tokens=[0, 1, 2, 1, 2, 1], parents=[-1, 0, 0, 1, 1, 3], depths=[0, 1, 1, 2, 2, 3])
    child = {(0, 1): 1, (0, 2): 2, (1, 1): 3, (1, 2): 4, (3, 1): 5}
    for seed in range(50):
        rng = random.Random(seed)
        seq = [rng.choice([1, 2, 3]) for _ in range(6)]
        it = iter(seq)
        accepted, out = draw_verify(tree, lambda u, it=it: next(it))
        u, want = 0, []
        for t in seq:
            want.append(t)
            if (u, t) not in child:
                break
            u = child[(u, t)]
        assert out == want
        assert [tree.tokens[a] for a in accepted] == want[:-1]


def _truncated(row, top_k=None, top_p=None):
    """A distribution cut to its top-k tokens and / or its smallest top-p nucleus, renormalised (as samplers do)."""
    order = sorted(range(len(row)), key=lambda x: -row[x])
    keep = set(order[:top_k] if top_k else order)
    if top_p is not None:
        mass, nucleus = 0.0, set()
        for x in order:
            nucleus.add(x)
            mass += row[x]
            if mass >= top_p:
                break
        keep &= nucleus
    s = sum(row[x] for x in keep)
    return [row[x] / s if x in keep else 0.0 for x in range(len(row))]


class _NeedDraw(Exception):
    def __init__(self, node):
        self.node = node


def exact_draw_distribution(tree, probs):
    """Output distribution of draw_verify itself when the draw at node u follows probs[u]: every sequence of
    draws is enumerated, each run through draw_verify, weighted by its probability."""
    out = defaultdict(float)
    stack = [((), 1.0)]
    while stack:
        seq, pr = stack.pop()
        made = iter(seq)

        def draw(u, made=made):
            x = next(made, None)
            if x is None:
                raise _NeedDraw(u)
            return x

        try:
            _, toks = draw_verify(tree, draw)
        except _NeedDraw as need:
            stack.extend((seq + (x,), pr * px) for x, px in enumerate(probs[need.node]) if px > 0)
            continue
        out[tuple(toks)] += pr
    return dict(out)


@settings(max_examples=200, deadline=None)
@given(
    tree=step_trees(), seed=st.integers(0, 10**6), cut=st.sampled_from([(None, None), (2, None), (None, 0.7), (3, 0.8)])
)
def test_draw_verify_is_autoregressive_under_top_k_top_p(tree, seed, cut):
    vocab = 4
    base = Target(seed, vocab)

    def target(ctx):
        return _truncated(base(ctx), *cut)

    assert_step_is_autoregressive(exact_draw_distribution(tree, _node_probs(tree, target)), tree, target, vocab)


def test_verification_reads_the_trees_rows_alone_in_one_pass():
    """Verification takes the argmax (and recycling's top tokens) of the scheduled trees' rows alone, in one call:
    each tree gets its own rows', in the trees' order, whichever rows the others hold (at a large batch most requests
    carry no tree); every row's where each x0's draw is its argmax."""
    from vllm_lookahead.backends.logit_rows import LogitRows
    from vllm_lookahead.glue.verification import _read_rows

    asked: list[tuple[list[int] | None, int]] = []

    class Recording(LogitRows):
        def pick(self, logits, rows=None, k=0):
            asked.append((rows, k))
            return super().pick(logits, rows, k)

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(12, 50, generator=g)
    full = logits.argmax(-1).tolist()
    top3 = logits.topk(3).indices.tolist()
    spans = [(7, 3), (0, 2), (4, 1)]  # not in row order, rows 2-3, 5-6 and 10-11 belong to no tree
    every, picks = _read_rows(Recording(), logits, spans, False, 0)
    assert every is None and [p.argmax for p in picks] == [full[7:10], full[0:2], full[4:5]]
    assert all(p.top is None for p in picks)
    assert asked == [([7, 8, 9, 0, 1, 4], 0)]
    every, picks = _read_rows(Recording(), logits, spans, False, 3)
    assert [p.top for p in picks] == [top3[7:10], top3[0:2], top3[4:5]]
    assert [p.argmax for p in picks] == [full[7:10], full[0:2], full[4:5]]
    every, picks = _read_rows(Recording(), logits, [(1, 2)], True, 0)  # every row: the x0 rows' draws too
    assert every == full and [p.argmax for p in picks] == [full[1:3]]
    assert asked[1:] == [([7, 8, 9, 0, 1, 4], 3), (None, 0)]
    assert _read_rows(Recording(), logits, [], False, 0) == (None, [])
