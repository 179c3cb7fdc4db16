import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_window import window_slots
from vllm_lookahead.core.tree import Candidate, Source, StepTree, build_step_tree, window_slots_max
from vllm_lookahead.core.window import JacobiWindow

VOCAB = 3  # tiny, so that paths collide and merging has work to do


@st.composite
def step_inputs(draw, max_w=4, max_n=4, max_g=4):
    w = draw(st.integers(1, max_w))
    n = draw(st.integers(2, max_n))
    tok = st.integers(0, VOCAB - 1)
    x0 = draw(tok)
    win = JacobiWindow(w, n, draw(st.lists(tok, min_size=w + n - 3, max_size=w + n - 3)), x0=x0)
    for _ in range(draw(st.integers(0, n))):
        win.step(draw(tok), draw(st.lists(tok, min_size=win.num_cols, max_size=win.num_cols)))
    win.set_x0(x0)
    g = draw(st.integers(0, max_g))
    cands = draw(st.lists(st.lists(tok, min_size=1, max_size=n), max_size=g))
    return x0, win, cands


def _root_path_tokens(tree, u):
    return tuple(tree.tokens[v] for v in tree.path(u))


def _slot_path(win, r, i):
    rows = win.rows
    return tuple(rows[0][: i + 1]) + tuple(rows[q][i] for q in range(1, r + 1))


def _check_valid(tree):
    n = tree.num_nodes
    assert tree.parents[0] == -1 and tree.depths[0] == 0
    assert len(tree.tokens) == len(tree.parents) == len(tree.depths) == n
    for u in range(1, n):
        assert 0 <= tree.parents[u] < u
        assert tree.depths[u] == tree.depths[tree.parents[u]] + 1
    for u in range(n):
        assert tree.children(u) == [c for c in range(n) if tree.parents[c] == u]
    assert all(0 <= u < n for u in tree.window_node.values())
    assert all(0 <= u < n for nodes in tree.candidate_nodes for u in nodes)


def test_window_slots_max():
    assert window_slots_max(7, 4) == 7 * 3
    assert window_slots_max(1, 2) == 1
    assert window_slots_max(1, 6) == 9  # warm-up level 2: 3 rows of 3 columns, steady is 5 rows of 1
    for w in range(1, 10):
        for n in range(2, 10):
            sizes = [(k + 1) * (w + n - 2 - k) for k in range(n - 1)]
            assert window_slots_max(w, n) == max(sizes)
            assert sizes[-1] == w * (n - 1)
            if w >= n - 2:
                assert window_slots_max(w, n) == w * (n - 1)


def test_chain():
    tree = StepTree.chain([5, 6, 7])
    assert tree.parents == [-1, 0, 1] and tree.depths == [0, 1, 2] and tree.is_chain
    assert tree.ancestor_mask().tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert StepTree.chain([5]).is_chain
    assert not build_step_tree(4, None, [[1, 2], [1, 3]]).is_chain


def test_small_example_node_order_candidates_first():
    win = JacobiWindow(3, 3, [5, 6, 7], x0=1)
    win.step(1, [9, 8, 8, 8])  # rows: [1, 6, 7], [8, 8, 8]
    tree = build_step_tree(1, win, [[6, 8], [2, 3]], merge=True)
    # candidates: 6 (1), 8 (2), 2 (3), 3 (4); window col 0: (1,0)=8 (5); col 1: (0,1)=6 merges with 1,
    # (1,1)=8 merges with 2; col 2: (0,2)=7 (6), (1,2)=8 (7)
    assert tree.tokens == [1, 6, 8, 2, 3, 8, 7, 8]
    assert tree.parents == [-1, 0, 1, 0, 3, 0, 1, 6]
    assert tree.depths == [0, 1, 2, 1, 2, 1, 2, 3]
    assert tree.window_node == {(0, 0): 0, (1, 0): 5, (0, 1): 1, (1, 1): 2, (0, 2): 6, (1, 2): 7}
    assert tree.candidate_nodes == [[1, 2], [3, 4]]
    assert tree.children(0) == [1, 3, 5] and tree.children(1) == [2, 6]
    unmerged = build_step_tree(1, win, [[6, 8], [2, 3]], merge=False)
    assert unmerged.num_nodes == 1 + 5 + 4
    assert unmerged.tokens == [1, 6, 8, 2, 3, 8, 6, 8, 7, 8]
    cut = tree.truncate(3)
    assert cut.tokens == [1, 6, 8]
    assert cut.window_node == {(0, 0): 0, (0, 1): 1, (1, 1): 2}
    assert cut.candidate_nodes == [[1, 2], []]
    assert build_step_tree(1, win, [[6, 8], [2, 3]], max_nodes=3).tokens == cut.tokens
    with pytest.raises(ValueError, match="max_nodes must be >= 1"):
        tree.truncate(0)


def test_window_none_and_empty():
    tree = build_step_tree(4, None, [])
    assert tree.tokens == [4] and tree.num_nodes == 1 and tree.ancestor_mask().tolist() == [[True]]
    tree = build_step_tree(4, None, [[1, 2], [1, 3]])
    assert tree.tokens == [4, 1, 2, 3] and tree.parents == [-1, 0, 1, 1]


@settings(max_examples=300, deadline=None)
@given(inp=step_inputs(), merge=st.booleans())
def test_tree_properties(inp, merge):
    x0, win, cands = inp
    tree = build_step_tree(x0, win, cands, merge=merge)
    _check_valid(tree)
    assert tree.tokens[0] == x0
    n = tree.num_nodes

    # Every node sees exactly itself and its ancestors.
    mask = tree.ancestor_mask().tolist()
    for u in range(n):
        assert {v for v in range(n) if mask[u][v]} == set(tree.path(u))
    assert tree.is_chain == all(tree.parents[u] == u - 1 for u in range(n))

    # Positions == depth, and every slot / candidate token is its own root path.
    assert set(tree.window_node) == {(r, i) for r, i, _ in window_slots(win)}
    for (r, i), u in tree.window_node.items():
        assert tree.depths[u] == r + i
        assert _root_path_tokens(tree, u) == _slot_path(win, r, i)
    assert len(tree.candidate_nodes) == len(cands)
    for cand, nodes in zip(cands, tree.candidate_nodes, strict=True):
        assert [tree.depths[u] for u in nodes] == list(range(1, len(cand) + 1))
        assert _root_path_tokens(tree, nodes[-1]) == (x0, *cand)
        assert tree.path(nodes[-1])[1:] == nodes

    # Candidates first: every node made for a candidate precedes every node made only for the window.
    cand_set = {u for nodes in tree.candidate_nodes for u in nodes}
    win_only = set(tree.window_node.values()) - cand_set - {0}
    if cand_set and win_only:
        assert max(cand_set) < min(win_only)
    assert cand_set | set(tree.window_node.values()) == set(range(n))

    if merge:
        # A trie: distinct root paths <-> distinct nodes, siblings have distinct tokens.
        assert len({_root_path_tokens(tree, u) for u in range(n)}) == n
        for u in range(n):
            kids = [tree.tokens[c] for c in tree.children(u)]
            assert len(kids) == len(set(kids))
    else:
        assert n == len(window_slots(win)) + sum(len(c) for c in cands)
        assert n <= window_slots_max(win.window_size, win.ngram_size) + len(cands) * (win.ngram_size - 1) or any(
            len(c) > win.ngram_size - 1 for c in cands
        )
        slot_node = tree.window_node
        win_nodes = set(slot_node.values()) - {0}
        # The paper's mask: (r, i) sees row 0 columns 0..i and column i rows 1..r, nothing else of the window.
        for (r, i), u in slot_node.items():
            expect = {slot_node[(0, j)] for j in range(i + 1)} | {slot_node[(q, i)] for q in range(1, r + 1)}
            assert {v for v in range(n) if mask[u][v]} == expect
            assert not any(mask[u][v] for v in cand_set)
        # Candidates see the root and their own earlier tokens; branches never see each other.
        for nodes in tree.candidate_nodes:
            for t, u in enumerate(nodes):
                assert {v for v in range(n) if mask[u][v]} == {0, *nodes[: t + 1]}
                assert not any(mask[u][v] for v in win_nodes)
        all_cand = [u for nodes in tree.candidate_nodes for u in nodes]
        assert len(all_cand) == len(set(all_cand))


@settings(max_examples=200, deadline=None)
@given(inp=step_inputs())
def test_merged_and_unmerged_have_same_root_paths(inp):
    x0, win, cands = inp
    merged = build_step_tree(x0, win, cands, merge=True)
    unmerged = build_step_tree(x0, win, cands, merge=False)
    paths_m = {_root_path_tokens(merged, u) for u in range(merged.num_nodes)}
    paths_u = {_root_path_tokens(unmerged, u) for u in range(unmerged.num_nodes)}
    assert paths_m == paths_u
    assert merged.num_nodes == len(paths_m) <= unmerged.num_nodes
    # Slot and candidate maps name the same root paths in both.
    for s in merged.window_node:
        assert _root_path_tokens(merged, merged.window_node[s]) == _root_path_tokens(unmerged, unmerged.window_node[s])


@settings(max_examples=150, deadline=None)
@given(inp=step_inputs(), merge=st.booleans(), data=st.data())
def test_any_prefix_cut_is_a_valid_tree(inp, merge, data):
    x0, win, cands = inp
    full = build_step_tree(x0, win, cands, merge=merge)
    m = data.draw(st.integers(1, full.num_nodes + 2))
    cut = full.truncate(m)
    built = build_step_tree(x0, win, cands, merge=merge, max_nodes=m)
    keep = min(m, full.num_nodes)
    for tree in (cut, built):
        _check_valid(tree)
        assert tree.num_nodes == keep
        assert tree.tokens == full.tokens[:keep]
        assert tree.window_node == {s: u for s, u in full.window_node.items() if u < keep}
        assert tree.candidate_nodes == [[u for u in nodes if u < keep] for nodes in full.candidate_nodes]
        assert torch.equal(tree.ancestor_mask(), full.ancestor_mask()[:keep, :keep])
        last = win.fill
        assert tree.window_output_nodes(last, win.num_cols) == [
            tree.window_node.get((last, i)) for i in range(win.num_cols)
        ]


def test_steptree_children_rebuilt_when_not_given():
    tree = StepTree(tokens=[0, 1, 2, 3], parents=[-1, 0, 0, 1], depths=[0, 1, 1, 2])
    assert tree.children(0) == [1, 2] and tree.children(1) == [3] and tree.children(3) == []
    assert tree.path(3) == [0, 1, 3]


def test_a_node_under_a_merged_parent_scores_from_that_parent():
    """The suffix tree makes token 1 likely (0.9); prompt lookup proposes 1 then 2, 2 at 0.8 given 1: node 2 is
    accepted with about 0.9 * 0.8, not the 0.24 of lookup's own path. The shared node keeps the source with the
    higher conditional (suffix's), the child its own."""
    suffix = Candidate([1], [0.9], Source.SUFFIX, [0.9])
    lookup = Candidate([1, 2], [0.3, 0.24], Source.LOOKUP)
    for cands in ([suffix, lookup], [lookup, suffix]):
        tree = build_step_tree(7, None, cands)
        one, two = tree.candidate_nodes[cands.index(lookup)]
        assert tree.scores[one] == pytest.approx(0.9) and tree.sources[one] == Source.SUFFIX
        assert tree.estimates[one] == pytest.approx(0.9)
        assert tree.scores[two] == pytest.approx(0.72) and tree.sources[two] == Source.LOOKUP
        assert tree.by_score().tokens[:3] == [7, 1, 2]
    # unmerged: each candidate keeps its own path
    tree = build_step_tree(7, None, [suffix, lookup], merge=False)
    assert sorted(tree.scores) == pytest.approx([0.24, 0.3, 0.9, 1.0])


@settings(max_examples=200, deadline=None)
@given(inp=step_inputs(), merge=st.booleans(), following=st.lists(st.integers(0, VOCAB - 1), max_size=6))
def test_follow_finds_the_nodes_a_continuation_goes_through(inp, merge, following):
    x0, win, cands = inp
    tree = build_step_tree(x0, win, cands, merge=merge)
    on, decided = tree.follow(following)
    # exactly the nodes whose root path (after x0) is a prefix of the continuation
    want = {u for u in range(tree.num_nodes) if list(_root_path_tokens(tree, u)[1:]) == following[: tree.depths[u]]}
    assert on == want
    # decided: no node the continuation reaches has a child whose position is not yet known
    undecided = any(tree.children(u) and tree.depths[u] >= len(following) for u in on)
    assert decided == (not undecided)


@settings(max_examples=200, deadline=None)
@given(
    inp=step_inputs(),
    merge=st.booleans(),
    conds=st.lists(st.sampled_from([0.2, 0.5, 0.9, 1.0]), min_size=16, max_size=16),
    window_score=st.sampled_from([0.0, 0.1, 0.5]),
    keep=st.integers(1, 30),
    above=st.sampled_from([None, 0.05, 0.3, 0.6]),
)
def test_by_score_cuts_in_the_same_pass_as_truncate(inp, merge, conds, window_score, keep, above):
    """by_score(k, above) is by_score() cut to its first k nodes and to those scoring above `above`, field for
    field (ties keep their order)."""
    x0, win, plain = inp
    cands = []
    for j, toks in enumerate(plain):
        scores, p = [], 1.0
        for d in range(len(toks)):
            p *= conds[(j * 4 + d) % len(conds)]
            scores.append(p)
        cands.append(Candidate(toks, scores, Source.SUFFIX))
    tree = build_step_tree(x0, win, cands, merge=merge, window_score=window_score)
    whole = tree.by_score()
    cap = keep if above is None else min(keep, max(1, sum(1 for s in whole.scores if s > above)))
    want, got = whole.truncate(cap), tree.by_score(keep, above)
    _check_valid(got)
    for f in ("tokens", "parents", "depths", "window_node", "candidate_nodes", "scores", "sources", "estimates"):
        assert getattr(got, f) == getattr(want, f), f
    assert got.child_lists == want.child_lists
