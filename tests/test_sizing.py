"""Tree sizing: the step-cost curve, the acceptance statistics, best-first trees and the choice of node counts."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.core.acceptance import CALIBRATION_RANGE, CALIBRATION_START, AcceptanceStats
from vllm_lookahead.core.cost import MEMORY, StepCost
from vllm_lookahead.core.sizing import MARGIN, Sizes, choose_sizes, plan_step, score_floor
from vllm_lookahead.core.step_timer import StepTimer
from vllm_lookahead.core.tree import Candidate, Source, StepTree, build_step_tree


def _tree(scores: list[float]) -> StepTree:
    """A chain whose nodes after the root have these (non-increasing) scores."""
    return build_step_tree(0, None, [Candidate(list(range(1, len(scores) + 1)), scores, Source.LOOKUP)])


def _sizes(trees: list[StepTree], *args, **kwargs) -> Sizes:
    """`choose_sizes` of these trees' scores."""
    return choose_sizes([t.scores for t in trees], *args, **kwargs)


@st.composite
def scored_candidates(draw):
    cands = []
    for _ in range(draw(st.integers(0, 6))):
        n = draw(st.integers(1, 5))
        toks = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
        raw = sorted(draw(st.lists(st.floats(0, 1), min_size=n, max_size=n)), reverse=True)
        cands.append(Candidate(toks, raw, draw(st.sampled_from([Source.LOOKUP, Source.POOL, Source.SUFFIX]))))
    return cands


@settings(max_examples=200, deadline=None)
@given(cands=scored_candidates(), k=st.integers(1, 30))
def test_by_score_keeps_the_tree_and_puts_the_best_first(cands, k):
    tree = build_step_tree(9, None, cands)
    best = tree.by_score()
    paths = {tuple(tree.tokens[v] for v in tree.path(u)) for u in range(tree.num_nodes)}
    assert {tuple(best.tokens[v] for v in best.path(u)) for u in range(best.num_nodes)} == paths
    assert all(best.parents[u] < u for u in range(1, best.num_nodes))
    assert best.scores == sorted(best.scores, reverse=True)
    # a prefix is the k best nodes, and a node's score is the best its root path got from any candidate
    assert sorted(best.truncate(k).scores, reverse=True) == sorted(tree.scores, reverse=True)[:k]
    for c in cands:
        for d in range(len(c.tokens)):
            node = next(
                u
                for u in range(best.num_nodes)
                if best.path(u)[1:] and [best.tokens[v] for v in best.path(u)[1:]] == list(c.tokens[: d + 1])
            )
            assert best.scores[node] >= c.scores[d]


def test_by_score_refuses_a_child_that_outscores_its_parent():
    tree = build_step_tree(0, None, [Candidate([1, 2], [0.1, 0.5], Source.POOL)])
    with pytest.raises(ValueError, match="outscores its parent"):
        tree.by_score()


# A concave curve (a 2-core Xeon without AVX512-BF16, bfloat16: ms against the tokens a step computes) and a knee.
CONCAVE = {1: 37.5, 2: 49.6, 3: 63.7, 4: 85.4, 6: 95.7, 8: 119.6, 12: 129.0, 16: 158.6, 24: 211.4, 32: 244.1, 48: 300.2,
           64: 402.9}  # fmt: skip
KNEE = {1: 30.0, 2: 30.1, 4: 30.3, 8: 30.6, 16: 40.0, 32: 61.0, 64: 103.0}


def _seeded(points: dict[int, float]) -> StepCost:
    cost = StepCost()
    cost.seed(list(points), [ms / 1e3 for ms in points.values()])
    return cost


def _ms(cost: StepCost, requests: int, tokens: float, branched: bool = False) -> float:
    return 1e3 * cost.curve(requests, branched).at(tokens)


def test_the_seed_prices_every_size_before_any_step():
    """Before the first request: the start-up timings themselves, linear between them, along the last slope past
    them, whatever the curve's shape (here concave: the first draft tokens the dearest)."""
    cost = _seeded(CONCAVE)
    assert cost.seeded
    for t, ms in CONCAVE.items():
        assert _ms(cost, 1, t) == pytest.approx(ms)
    assert _ms(cost, 1, 5) == pytest.approx((85.4 + 95.7) / 2)
    assert _ms(cost, 1, 96) == pytest.approx(402.9 + 32 * (402.9 - 300.2) / 16)
    # a batch whose band nobody measured: the seed too
    assert _ms(cost, 16, 32) == pytest.approx(244.1)


def test_a_seed_size_timed_while_the_machine_was_busy_is_priced_as_the_larger_sizes_say():
    """Noise only adds time, and more tokens never cost less: a start-up timing above a larger size's is that size's
    at most (32 tokens timed at 3x, between 16 at 1.4x and 64 at 1.6x)."""
    cost = _seeded({1: 30.0, 2: 31.0, 4: 30.0, 8: 31.0, 16: 42.0, 32: 97.0, 64: 46.0})
    assert _ms(cost, 1, 32) == pytest.approx(46.0) and _ms(cost, 1, 16) == pytest.approx(42.0)
    assert _ms(cost, 1, 4) == pytest.approx(30.0, rel=1e-3) and _ms(cost, 1, 1) == pytest.approx(30.0)


def test_a_measured_size_is_priced_as_measured_and_an_unmeasured_one_never_below_the_seed():
    """Steps cost what the seed says plus the engine's own work (7 ms): the measured sizes at their medians, those
    between them interpolated, those past them the seed plus the nearest measured excess. Where steps came out
    cheaper than the seed (8 tokens at 100 ms), that size is priced so, but the sizes nobody measured around it stay
    at or above the seed."""
    cost = _seeded(CONCAVE)
    for _ in range(5):
        cost.observe(1, 0, False, (37.5 + 7) / 1e3)
        cost.observe(1, 3, False, (85.4 + 7) / 1e3)
    assert _ms(cost, 1, 1) == pytest.approx(44.5) and _ms(cost, 1, 4) == pytest.approx(92.4)
    assert _ms(cost, 1, 2) == pytest.approx(49.6 + 7) and _ms(cost, 1, 32) == pytest.approx(244.1 + 7)
    for _ in range(5):
        cost.observe(1, 7, False, 0.100)
    assert _ms(cost, 1, 8) == pytest.approx(100.0, rel=0.02)  # (raised to rise from 6 tokens by MIN_SLOPE_SHARE)
    for t in (12, 16, 24, 64):
        assert _ms(cost, 1, t) >= CONCAVE[t]


def test_a_concave_curve_is_learned_as_it_is():
    """The engine's steps on the concave curve with 3% noise at every size: each size is priced within a few percent
    of the truth, the first draft tokens dear and the later ones cheap (nothing made convex)."""
    cost = _seeded({1: 0.030, 2: 0.031, 64: 0.060})  # a seed of another machine: the steps correct it
    rng = random.Random(2)
    sizes = list(CONCAVE)
    for _ in range(40):
        for t in sizes:
            cost.observe(1, t - 1, False, CONCAVE[t] / 1e3 * rng.uniform(0.97, 1.03))
    for t in sizes:
        assert _ms(cost, 1, t) == pytest.approx(CONCAVE[t], rel=0.05)
    assert (_ms(cost, 1, 4) - _ms(cost, 1, 1)) / 3 > 2 * (_ms(cost, 1, 64) - _ms(cost, 1, 48)) / 16


def test_one_slow_step_moves_no_price():
    """A price is its size's median step: one step slowed threefold by the machine changes nothing."""
    cost = _seeded(KNEE)
    for _ in range(10):
        cost.observe(1, 7, True, 0.0306)
    before = _ms(cost, 1, 8, True)
    cost.observe(1, 7, True, 0.0918)
    assert _ms(cost, 1, 8, True) == pytest.approx(before)


@settings(max_examples=80, deadline=None)
@given(
    seed=st.lists(st.floats(0.001, 1.0), min_size=1, max_size=8),
    steps=st.lists(
        st.tuples(st.integers(1, 64), st.integers(0, 200), st.booleans(), st.floats(0.0005, 2.0)), max_size=60
    ),
)
def test_prices_never_fall_as_tokens_grow(seed, steps):
    """Whatever the seed and the steps say (noise, a size dearer than a larger one): a price never falls as a step
    computes more tokens, and each token costs at least MIN_SLOPE_SHARE of the seed's slope."""
    cost = StepCost(max_tokens=512)
    cost.seed([2**i for i in range(len(seed))], seed)
    for r, d, b, sec in steps:
        cost.observe(r, d, b, sec)
    for requests in (1, 4, 16, 64):
        for branched in (False, True):
            curve = cost.curve(requests, branched)
            assert (np.diff(curve.seconds) >= -1e-12).all()
            t = np.arange(1, 700, dtype=float)
            assert (np.diff(curve.prices(t)) >= -1e-12).all()


def test_each_band_of_requests_learns_its_own_prices_and_an_unmeasured_band_borrows_the_nearest():
    """One request and sixteen cost differently beyond the seed (the per-request work); a band of eight with no
    step yet takes the nearest measured band's excess (here sixteen's, two bands away; one request's is five), never
    below the seed."""
    cost = _seeded(KNEE)
    for _ in range(5):
        cost.observe(1, 0, False, 0.032)
        cost.observe(16, 0, False, 0.040 + 0.010)
    assert _ms(cost, 1, 16) == pytest.approx(40.0 + 2.0)
    assert _ms(cost, 16, 16) == pytest.approx(50.0)
    assert _ms(cost, 8, 16) == pytest.approx(50.0)
    assert _ms(cost, 2, 16) == pytest.approx(42.0)  # the band of 2: one request's, the nearest


def test_branched_steps_are_priced_apart_once_measured():
    """No branched step yet: a branched step is priced as an unbranched one (the same curve). Once branched steps
    cost more (the tree kernel's own price on some layouts), they are priced so, and unbranched ones are not."""
    cost = _seeded(KNEE)
    assert cost.curve(1, True) is cost.curve(1)
    for _ in range(5):
        cost.observe(1, 7, False, 0.0306)
        cost.observe(1, 7, True, 0.0406)
    assert _ms(cost, 1, 8) == pytest.approx(30.6) and _ms(cost, 1, 8, True) == pytest.approx(40.6)


def test_a_size_not_measured_for_a_while_is_priced_from_its_neighbours_again():
    """A cell forgets its steps after MEMORY steps: the size is then priced from the sizes measured since (and so
    tried again where it pays), not from an old measurement."""
    cost = _seeded(KNEE)
    for _ in range(5):
        cost.observe(1, 7, False, 0.090)  # a slow moment
    assert _ms(cost, 1, 8) == pytest.approx(90.0)
    for _ in range(MEMORY):
        cost.observe(1, 0, False, 0.030)
    assert _ms(cost, 1, 8) == pytest.approx(30.6)


def test_fixed_costs_learn_nothing():
    frozen = StepCost(relative_node_cost=0.1)
    frozen.observe(10, 0, False, 5.0)
    frozen.seed([1, 2], [1.0, 9.0])
    assert frozen.seconds(3, 7) == pytest.approx(2.0)  # 1 + 0.1 per token computed
    line = StepCost.fixed([1, 64], [0.03, 0.093])
    line.observe(1, 0, False, 5.0)
    assert line.seconds(1, 63) == pytest.approx(0.093) and line.seconds(1, 127) == pytest.approx(0.157)


def test_on_a_concave_curve_the_sizing_drafts_nothing_or_enough_to_pay():
    """The first draft token costs a third of a step and later ones far less: one node of 0.3 does not pay for
    itself, but ten nodes of that worth together do. A stopping rule that ends at the first node that does not pay
    (right only for convex costs) would draft nothing."""
    cost = StepCost.fixed(list(CONCAVE), [ms / 1e3 for ms in CONCAVE.values()])
    one = _sizes([_tree([0.3])], [100], 1, cost, budget=100)
    assert one.sizes == [1]
    many = _sizes([_tree([0.95] + [0.9] * 11)], [100], 1, cost, budget=100)
    assert many.sizes == [13]
    assert many.rate > 1 / cost.seconds(1, 0)


@settings(max_examples=100, deadline=None)
@given(
    prices=st.lists(st.floats(0.0, 0.5), min_size=2, max_size=10),
    requests=st.integers(1, 20),
    scores=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40),
)
def test_the_chosen_size_is_the_best_rate(prices, requests, scores):
    """Whatever the curve's shape, the sizing takes the size with the best expected tokens per second among all
    the sizes of the same best-first nodes, if it beats plain decoding by MARGIN; else none."""
    tree = _tree(sorted(scores, reverse=True))
    points = [2**i for i in range(len(prices))]
    cost = StepCost.fixed(points, np.cumsum([0.03, *prices[1:]]).tolist())
    chosen = _sizes([tree], [100], requests, cost, budget=100)
    rates = [(requests + sum(tree.scores[1:k])) / cost.seconds(requests, k - 1) for k in range(1, tree.num_nodes + 1)]
    best = max(rates)
    if best > rates[0] * (1 + MARGIN):
        assert chosen.rate == pytest.approx(best, rel=1e-9)
    else:
        assert chosen.sizes == [1]


@settings(max_examples=60, deadline=None)
@given(
    prices=st.lists(st.floats(0.0, 0.5), min_size=2, max_size=10),
    requests=st.integers(1, 24),
    cands=st.lists(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8), min_size=1, max_size=6),
)
def test_no_node_at_or_below_the_floor_is_taken(prices, requests, cands):
    """`score_floor` is a bar no chosen node falls to, on any curve: so the sources need not draft below it."""
    points = [2**i for i in range(len(prices))]
    cost = StepCost.fixed(points, np.cumsum([0.03, *prices[1:]]).tolist())
    trees = [_tree(sorted(c, reverse=True)) for c in cands] * requests
    trees = trees[:requests]
    floor = score_floor(cost, requests)
    sizes = _sizes(trees, [100] * requests, requests, cost, budget=1000).sizes
    assert all(t.scores[k - 1] > floor for t, k in zip(trees, sizes, strict=True) if k > 1)


def test_sizes_follow_cost_and_scores():
    tree = _tree([0.9, 0.8, 0.5, 0.3, 0.1, 0.05, 0.02])
    free, dear = StepCost(relative_node_cost=0.0), StepCost(relative_node_cost=0.1)
    assert _sizes([tree], [100], 1, free, budget=100).sizes == [8]  # every node with a chance pays when free
    few = _sizes([tree], [100], 1, dear, budget=100).sizes[0]
    assert 1 < few < 8
    # a token as dear as a whole step: 0.9 and 0.8 still pay ((1 + 0.9) / 3 > 1 / 2, 2.7 / 4 > 1.9 / 3), 0.5 not
    assert _sizes([tree], [100], 1, StepCost(relative_node_cost=1.0), budget=100).sizes == [3]
    sure = _tree([0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.93])
    assert _sizes([sure], [100], 1, dear, budget=100).sizes[0] > few
    # caps and the budget hold
    assert _sizes([tree], [3], 1, free, budget=100).sizes == [3]
    assert _sizes([tree, sure], [100, 100], 2, free, budget=5).sizes == [1, 6]


def test_dearer_tokens_shrink_trees_then_turn_drafting_off():
    """As steps get dearer per token, trees shrink; a batch of many requests drafts nothing."""
    tree = _tree([0.6, 0.4, 0.3, 0.2, 0.1])
    sizes = []
    for slope in (0.001, 0.01, 0.05, 0.2):
        cost = _seeded({t: 0.02 * (1 + slope * t) for t in (1, 2, 4, 8, 16, 32, 64)})
        sizes.append(_sizes([tree], [100], 1, cost, budget=100).sizes[0])
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 6 and sizes[-1] < 6
    # 16 requests: a node must be worth more than (16 * 0.03 / (1 + 16 * 0.03)) (1 + MARGIN) = 0.33 to pay
    cost = StepCost(relative_node_cost=0.03)
    assert _sizes([_tree([0.32, 0.2])] * 16, [100] * 16, 16, cost, budget=1000).sizes == [1] * 16
    assert _sizes([_tree([0.36, 0.2])] * 16, [100] * 16, 16, cost, budget=1000).sizes == [2] * 16


@settings(max_examples=60, deadline=None)
@given(
    slope=st.sampled_from([0.0, 0.005, 0.03, 0.1, 0.5]),
    batch=st.integers(1, 24),
    trained=st.sampled_from([None, Source.POOL, Source.LOOKUP, Source.WINDOW]),
    seed=st.integers(0, 1000),
)
def test_trees_built_above_the_floor_give_the_same_drafts(slope, batch, trained, seed):
    """Leaving out the nodes under `score_floor` changes no step's drafts: the sizing never takes them."""
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.core.state import LookaheadState

    rng = random.Random(seed)
    stats = AcceptanceStats()
    if trained is not None:  # a source that has been accepted often, so some nodes clear the bar
        probe = build_step_tree(0, None, [Candidate([1, 2, 3], [0.3, 0.1, 0.05], trained)])
        for _ in range(500):
            stats.observe(probe, [1, 2, 3] if trained != Source.WINDOW else [])
    params = LookaheadParams(window_size=3, ngram_size=3, guess_set_size=4, suffix_candidates=0)
    prompts = [[rng.randrange(12) for _ in range(rng.randint(4, 60))] for _ in range(batch)]
    cost = StepCost(relative_node_cost=slope)
    floor = score_floor(cost, batch)
    full, cut = [], []
    for prompt in prompts:
        x0 = rng.randrange(12)
        full.append(LookaheadState(params, prompt, stats=stats).build_tree(x0))
        cut.append(LookaheadState(params, prompt, stats=stats).build_tree(x0, min_score=floor))
    assert all(min(t.scores[1:], default=1.0) > floor for t in cut)
    caps = [100] * batch
    sizes_full = _sizes(full, caps, batch, cost, budget=1000).sizes
    sizes_cut = _sizes(cut, caps, batch, cost, budget=1000).sizes
    assert sizes_full == sizes_cut
    for a, b, k in zip(full, cut, sizes_full, strict=True):
        # the same nodes, but for the order among equal scores (where merging made a node later in one tree)
        assert a.scores[:k] == b.scores[:k]
        last = a.scores[k - 1]

        def above(t: StepTree, k: int = k, last: float = last) -> set[tuple[int, ...]]:
            return {tuple(t.tokens[v] for v in t.path(u)) for u in range(k) if t.scores[u] > last}

        assert above(a) == above(b)


def test_a_dear_step_drafts_no_nodes_at_all():
    """16 requests at a relative node cost of 0.03: no untrained pool n-gram (prior 0.3) or window slot clears
    the bar (0.32), so none is even drafted; a likelier source's nodes (prompt lookup on an 8-token match, prior
    0.9) still are."""
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.core.state import LookaheadState

    cost = StepCost(relative_node_cost=0.03)
    floor = score_floor(cost, 16)
    assert floor == pytest.approx(16 * 0.03 / (1 + 16 * 0.03))
    params = LookaheadParams(suffix_candidates=0, lookup_candidates=0)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    assert LookaheadState(params, prompt).build_tree(4).num_nodes > 5
    assert LookaheadState(params, prompt).build_tree(4, min_score=floor).num_nodes == 1
    lookup = LookaheadParams(suffix_candidates=0, lookup_candidates=1)
    tree = LookaheadState(lookup, prompt).build_tree(4, min_score=floor)
    assert tree.num_nodes > 1 and set(tree.sources[1:]) == {Source.LOOKUP_LONG}


def test_acceptance_rates_follow_verification():
    stats = AcceptanceStats()
    before = stats.factor(Source.POOL, 1)
    tree = build_step_tree(0, None, [Candidate([1, 2], [0.3, 0.1], Source.POOL)])
    for _ in range(3000):
        stats.observe(tree, [1, 2])  # always accepted
    assert stats.factor(Source.POOL, 1) > 0.95 > before
    for _ in range(3000):
        stats.observe(tree, [])  # never
    assert stats.factor(Source.POOL, 1) < 0.05
    # depth 2 was only tried when depth 1 was accepted: its rate stayed high
    assert stats.factor(Source.POOL, 2) > 0.9
    assert stats.path_scores(Source.POOL, None, 2)[1] <= stats.path_scores(Source.POOL, None, 2)[0]


def test_carried_nodes_accepted_under_their_scores_shrink_the_trees():
    """The calibration: of trees carried at a summed score of 2.4, one node was accepted each time; a score is then
    worth 1 / 2.4 of itself, and the sizing takes fewer nodes. It starts at CALIBRATION_START and stays within its
    range."""
    tree = _tree([0.9, 0.6, 0.5, 0.4])
    stats = AcceptanceStats()
    assert stats.calibration == pytest.approx(CALIBRATION_START)
    dear = StepCost(relative_node_cost=0.3)
    # trusted: 0.9, 0.6 and 0.5 pay (0.5 > 2.5 * 0.3 / 1.6), 0.4 not (3.0 * 0.3 / 1.9 = 0.47)
    assert _sizes([tree], [100], 1, dear, budget=100).sizes == [4]
    for _ in range(3000):
        stats.observe_carried(tree, [1])
    assert stats.calibration == pytest.approx(1 / 2.4, rel=0.02)
    # scaled: 0.375 pays, 0.25 not (1.375 * 0.3 / 1.3 = 0.32)
    assert _sizes([tree], [100], 1, dear, budget=100, scales=[stats.calibration]).sizes == [2]
    assert plan_step([tree], [100], 1, dear, budget=100, scales=[stats.calibration])[1] == [2]
    for _ in range(5000):
        stats.observe_carried(tree, [])
    assert stats.calibration == CALIBRATION_RANGE[0]
    for _ in range(5000):
        stats.observe_carried(tree, [1, 2, 3, 4])
    assert stats.calibration == CALIBRATION_RANGE[1]


def test_window_is_worth_what_its_ngrams_yield():
    stats = AcceptanceStats()
    from vllm_lookahead.core.window import JacobiWindow

    win = JacobiWindow(2, 3, [5, 6])
    win.set_x0(4)
    found = Candidate([8, 9], [0.2, 0.1], Source.JACOBI)
    tree = build_step_tree(4, win, [found])
    jacobi_nodes = tree.candidate_nodes[0]
    v0 = stats.window_value
    for _ in range(2000):
        stats.observe(tree, jacobi_nodes)
    assert stats.window_value > 10 * v0


def test_rising_acceptance_grows_trees_through_the_state():
    """Pool candidates that keep being accepted score higher, so more of them pay at the same step cost."""
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.core.state import LookaheadState

    params = LookaheadParams(window_size=1, ngram_size=4, guess_set_size=4, lookup_candidates=0, suffix_candidates=0)
    stats = AcceptanceStats()
    prompt = [7, 1, 2, 3, 7, 4, 5, 6, 7, 8, 9, 10]
    cost = StepCost(relative_node_cost=0.2)

    def size() -> int:
        tree = LookaheadState(params, prompt, stats=stats).build_tree(7)
        return _sizes([tree], [100], 1, cost, budget=100).sizes[0]

    before = size()
    probe = build_step_tree(0, None, [Candidate([1, 2, 3], [0.3, 0.1, 0.05], Source.POOL)])
    for _ in range(3000):
        stats.observe(probe, [1, 2, 3])
    assert size() > before


def test_shared_pool_stays_within_its_bound():
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.core.pool import NGramPool
    from vllm_lookahead.core.state import LookaheadState

    params = LookaheadParams(shared_pool_keys=50, suffix_candidates=0)
    shared = NGramPool(params.ngram_size, params.guess_set_size, params.shared_pool_keys)
    rng = random.Random(1)
    for r in range(5):
        state = LookaheadState(params, [rng.randrange(1000) for _ in range(100)], shared=shared, req_id=r)
        state.catch_up(400, lambda a, b: [rng.randrange(1000) for _ in range(b - a)])
        tree = state.build_tree(rng.randrange(1000))
        assert tree.num_nodes >= 1
        state.close()
    assert 0 < len(shared) <= 50
    assert all(len(shared.get(k)) <= params.guess_set_size for k in shared.keys())
    # what one request learned is a candidate for the next
    first = LookaheadState(params, [1, 2, 3, 4], shared=shared)
    first.catch_up(8, lambda a, b: [1, 2, 3, 4][: b - a])
    second = LookaheadState(params, [9, 9], shared=shared)
    tree = second.build_tree(1)
    assert Source.SHARED in tree.sources


def _branching() -> StepTree:
    """x0 -> a (0.8) -> b (0.6), and a second guess at the first place, c (0.3)."""
    cands = [Candidate([1, 2], [0.8, 0.6], Source.SUFFIX), Candidate([3], [0.3], Source.POOL)]
    return build_step_tree(0, None, cands).by_score()


def test_best_chain_follows_the_best_child():
    tree = _branching()
    assert tree.tokens == [0, 1, 2, 3] and not tree.is_chain and tree.prefix_is_chain(3)
    chain = tree.best_chain()
    assert chain.is_chain and chain.tokens == [0, 1, 2] and chain.scores == [1.0, 0.8, 0.6]
    assert chain.best_chain() is chain


def _priced(branch: float, slope: float = 0.05) -> StepCost:
    """A measured cost: 1 + slope per request or draft, plus `branch` when the trees branch."""
    cost = StepCost()
    rng = random.Random(3)
    for _ in range(800):
        r, d, b = rng.randint(1, 16), rng.randint(0, 24), rng.random() < 0.5
        cost.observe(r, d, b, 1 + slope * (r + d) + branch * b)
    return cost


def test_plan_step_pays_the_branch_price_only_when_the_branches_earn_it():
    tree = _branching()
    # no branch price: the whole tree (its third node, score 0.3, pays at this slope)
    trees, sizes = plan_step([tree], [100], 1, _priced(0.0), budget=100)
    assert trees == [tree] and sizes == [4]
    # a price above what the branch brings (0.3 tokens at about 1.2 per step): the best chain alone
    trees, sizes = plan_step([tree], [100], 1, _priced(0.5), budget=100)
    assert trees[0].is_chain and trees[0].tokens == [0, 1, 2] and sizes == [3]
    # a small price: the branch still pays
    trees, sizes = plan_step([tree], [100], 1, _priced(0.05), budget=100)
    assert trees == [tree] and sizes == [4]
    # sixteen requests: the price is shared by the batch, but so is each node's bar
    many, sizes = plan_step([tree] * 16, [100] * 16, 16, _priced(0.5), budget=1000)
    assert all(t.is_chain for t in many)


@settings(max_examples=60, deadline=None)
@given(cands=scored_candidates(), branch=st.sampled_from([0.0, 0.02, 0.3, 3.0]), batch=st.integers(1, 8))
def test_plan_step_never_expects_less_than_plain_decoding(cands, branch, batch):
    tree = build_step_tree(9, None, cands).by_score()
    cost = _priced(branch)
    trees, sizes = plan_step([tree] * batch, [100] * batch, batch, cost, budget=1000)
    assert all(1 <= k <= t.num_nodes for t, k in zip(trees, sizes, strict=True))
    branched = any(not t.prefix_is_chain(k) for t, k in zip(trees, sizes, strict=True))
    expected = batch + sum(sum(t.scores[1:k]) for t, k in zip(trees, sizes, strict=True))
    seconds = cost.seconds(batch, sum(sizes) - batch, branched)
    assert expected / seconds >= batch / cost.seconds(batch, 0) - 1e-9


def test_max_factor_follows_every_observation():
    """max_factor is remembered between observations (every request of a step asks it) and never stale after one."""
    stats = AcceptanceStats()

    def fresh(source: Source, depth: int) -> float:
        return max(stats.factor(source, d) for d in range(1, depth + 1))

    tree = build_step_tree(0, None, [Candidate([1, 2, 3], [0.5, 0.4, 0.3], Source.LOOKUP)])
    first = stats.max_factor(Source.LOOKUP, 3)
    assert first == fresh(Source.LOOKUP, 3)
    for _ in range(50):
        stats.observe(tree, [1, 2, 3])  # every node accepted: the factors rise
        assert stats.max_factor(Source.LOOKUP, 3) == fresh(Source.LOOKUP, 3)
    assert stats.max_factor(Source.LOOKUP, 3) > first


def test_a_step_costs_its_span_and_the_engine_work_until_the_next_one():
    """A decoding step is complete when the next step begins: its span (start to the end of drafting) plus the gap
    to the next start, which is the engine's own work between steps; a gap longer than the step is idle time and
    is left out; steps that are not pure decoding are not timed, and one whose drafting never ended neither."""
    timer = StepTimer(cold=0)
    assert timer.begin(0.0, 16, 8) is None
    timer.branched(True)
    timer.end(0.050)
    # a step that prefills closes the one before and is not timed itself
    assert timer.begin(0.052, 16, None) == (16, 8, True, pytest.approx(0.052))
    timer.end(0.120)
    assert timer.begin(0.121, 4, 2) is None
    timer.end(0.151)
    assert timer.begin(5.0, 1, 0) == (4, 2, False, pytest.approx(0.030))  # 4.85 s without work: the span alone
    assert timer.begin(5.1, 1, 0) is None  # the step at 5.0 never ended its drafting
    # the totals the worker's stats report: two steps timed, their spans, and the one gap that counted
    assert timer.timed == 2
    assert timer.span_seconds == pytest.approx(0.050 + 0.030)
    assert timer.gap_seconds == pytest.approx(0.002)


# An engine's first timed steps at 4 chat requests after a repetitive warm-up, bfloat16, 2-core CPU (requests, drafts,
# branched, ms): the first three are cold (first-use costs), the rest as later steps of their size.
COLD_TRACE = [
    (4, 56, 0, 43.11), (4, 60, 1, 46.31), (4, 0, 0, 37.62), (4, 32, 1, 29.74), (4, 56, 1, 39.55), (4, 36, 1, 32.18),
    (4, 36, 1, 28.96), (4, 21, 1, 24.44), (4, 36, 1, 28.46), (4, 22, 1, 29.18), (4, 28, 1, 27.58), (4, 28, 1, 26.14),
]  # fmt: skip


def test_an_engines_first_steps_are_left_out():
    """The engine's first COLD_STEPS complete steps pay first-use costs (the trace's first three are 1.1-1.5x the
    later steps of their size): they never reach the step cost."""
    from vllm_lookahead.core.step_timer import COLD_STEPS

    seen = []

    class Recording(StepCost):
        def observe(self, *step) -> None:
            seen.append(step)

    timer, now, cost = StepTimer(cold=COLD_STEPS), 0.0, Recording()
    for requests, drafts, branched, ms in COLD_TRACE:
        if (timed := timer.begin(now, requests, drafts)) is not None:
            cost.observe(*timed)
        timer.branched(bool(branched))
        now += ms / 1e3
        timer.end(now)
    assert COLD_STEPS >= 3 and timer.timed == len(seen) == len(COLD_TRACE) - 1 - COLD_STEPS
    assert [d for _, d, _, _ in seen] == [d for _, d, _, _ in COLD_TRACE[COLD_STEPS:-1]]
