"""Token recycling: the table of the target's top tokens, its rank estimates, and its nodes in the state's tree."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.core.recycle import TokenRecycler
from vllm_lookahead.core.state import LookaheadState
from vllm_lookahead.core.tree import Source
from vllm_lookahead.core.verify import greedy_verify


def test_candidates_follow_the_table_best_ranks_first():
    r = TokenRecycler(top_k=3)
    # after 1 came 2 (the model's best), 5 and 6; after 2: 3, 7, 8; after 3: 4, 9, 10
    r.observe([1, 2, 3], [[2, 5, 6], [3, 7, 8], [4, 9, 10]], [2, 3, 4])
    est = r.rank_estimates()
    assert est[0] > est[1] > est[2] > 0
    paths = r.candidates(1, 3)
    nodes = {tuple(p[: i + 1]) for p, _ in paths for i in range(len(p))}
    assert len(nodes) == 3
    assert (2,) in nodes and (2, 3) in nodes  # the chain of best guesses goes deepest
    for tokens, estimates in paths:
        assert len(tokens) == len(estimates)
    assert r.candidates(1, 0) == []
    assert r.candidates(99, 5) == []  # nothing known after 99


def test_rank_estimates_learn_where_the_next_token_was():
    r = TokenRecycler(top_k=4)
    r.observe([1], [[2, 3, 4, 5]], [2])
    before = r.rank_estimates()
    for _ in range(50):  # each time token 1 came, it was followed by its entry's second token
        r.observe([1], [[2, 3, 4, 5]], [3])
    after = r.rank_estimates()
    assert after[1] > before[1] and after[1] > after[0]
    assert sum(after) <= 1.0 + 1e-9


@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(st.integers(0, 20), st.lists(st.integers(0, 20), min_size=1, max_size=4, unique=True)),
    st.integers(0, 20),
    st.integers(0, 30),
)
def test_candidates_stay_within_their_cap_and_the_table(table, x0, cap):
    r = TokenRecycler(top_k=4)
    for tok, row in table.items():
        r.observe([tok], [row], [row[0]])
    paths = r.candidates(x0, cap)
    nodes = {tuple(p[: i + 1]) for p, _ in paths for i in range(len(p))}
    assert len(nodes) <= cap
    for p, _ in paths:  # every step of a path is a guess the table holds for the token before it
        prev = x0
        for t in p:
            assert t in table[prev]
            prev = t


def test_recycled_nodes_hang_in_the_state_tree_and_verify_exactly():
    params = LookaheadParams(lookup_candidates=0, suffix_candidates=0, guess_set_size=0, recycle_candidates=8)
    recycle = TokenRecycler()
    state = LookaheadState(params, [5, 6, 7], recycle=recycle)
    tree = state.build_tree(7)
    assert Source.RECYCLE not in tree.sources  # nothing recycled yet
    # the target's argmax at x0=7 was 8 and its top tokens there [8, 9]; at 8: [10, 11]
    argmax = [8] + [0] * (tree.num_nodes - 1)
    _, tokens = greedy_verify(tree, argmax)
    state.update(tree, argmax, tokens, [[8, 9]])
    assert recycle.table[7] == (8, 9)
    recycle.observe([8], [[10, 11]], [10])
    tree = state.build_tree(8)
    recycled = [tree.tokens[u] for u in range(1, tree.num_nodes) if tree.sources[u] == Source.RECYCLE]
    assert 10 in recycled
    # verification of a recycled node is the plain greedy rule: accepted where the target's argmax says so
    argmax = [10] + [0] * (tree.num_nodes - 1)
    for u in range(1, tree.num_nodes):
        if tree.tokens[u] == 10 and tree.depths[u] == 1:
            argmax[u] = 12
    accepted, tokens = greedy_verify(tree, argmax)
    assert tokens[:2] == [10, 12]
    assert tree.sources[accepted[0]] == Source.RECYCLE


def test_off_by_key_or_without_a_table():
    off = LookaheadState(LookaheadParams(recycle_candidates=0), [1, 2], recycle=TokenRecycler())
    assert off.recycle is None
    assert LookaheadState(LookaheadParams(), [1, 2]).recycle is None


def test_no_guess_is_drafted_under_a_bar_none_can_clear():
    """candidates() returns nothing at once where even the best rank's estimate, scaled, is at most the floor."""
    r = TokenRecycler(top_k=3)
    r.observe([1, 2], [[2, 5, 6], [3, 7, 8]], [2, 3])
    best = r.best_estimate()
    assert best == max(r.rank_estimates())
    assert r.candidates(1, 4, floor=best - 1e-6)
    assert r.candidates(1, 4, floor=best) == []
    assert r.candidates(1, 4, floor=best, scale=2.0)  # a calibration that doubles the estimates clears it again
    assert r.best_estimate(scale=100.0) == 1.0


def test_the_table_is_taught_where_the_bar_lets_recycled_guesses_in():
    """Verification reads the target's top tokens at the trees' rows (with their argmax, in one pass) only where the
    last drafted step's bar (`score_floor`) was below what a recycled guess under x0 scores at best; an empty table
    is taught too, and every rank always under tensor parallelism. The table learns them along the verified path."""
    from vllm_lookahead.glue.engine import LookaheadEngine

    engine = LookaheadEngine(LookaheadParams(), max_model_len=64)
    gate = engine.recycling

    def top_k(floor: float) -> int:
        gate.decide(floor, [engine.acceptance])
        return gate.top_k()

    assert not gate.recycle.table
    best = gate.recycle.best_estimate(engine.acceptance.factor(Source.RECYCLE, 1) * engine.acceptance.calibration)
    assert top_k(best - 1e-6) == gate.recycle.top_k
    assert top_k(best) == 0  # a large batch on a CPU: no recycled guess would be drafted
    assert top_k(0.0) == gate.recycle.top_k  # tensor parallelism: no bar
    gate.recycle = None
    assert top_k(0.0) == 0


class _Rate:
    """Acceptance statistics whose recycled guesses are accepted at `rate` times their estimates, and whose carried
    nodes at `calibration` times their scores."""

    def __init__(self, rate: float, calibration: float = 1.0) -> None:
        self.rate, self.calibration = rate, calibration

    def factor(self, source: Source, depth: int) -> float:
        assert source == Source.RECYCLE and depth == 1
        return self.rate


def test_only_the_step_s_kinds_of_request_decide_whether_recycling_may_pay():
    """A greedy run's recycled guesses earning a third of their estimates keep the table untaught under a bar they
    cannot clear, though the sampled statistics, which no request of the step uses, still sit at their prior."""
    from vllm_lookahead.glue.engine import LookaheadEngine

    engine = LookaheadEngine(LookaheadParams(), max_model_len=64)
    gate = engine.recycling
    assert engine.shared.acceptance_sampled.factor(Source.RECYCLE, 1) == 1.0  # the prior: nothing sampled was seen
    best = gate.recycle.best_estimate()
    bar = best / 2  # above what a guess earning a third of its estimate scores, below a guess at its estimate
    assert not gate.may_pay(bar, [_Rate(1 / 3)])  # greedy requests alone
    assert gate.may_pay(bar, [_Rate(1 / 3), _Rate(1.0)])  # with sampled ones that earn their estimates
    assert gate.may_pay(0.0, [_Rate(1 / 3)])  # no bar (tensor parallelism)
    assert not gate.may_pay(bar, [_Rate(1.0, calibration=1 / 3)])  # scores worth a third: the drafting's bar too
