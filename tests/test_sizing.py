"""Tree sizing: the step-cost line, the acceptance statistics, best-first trees and the choice of node counts."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.core.acceptance import CALIBRATION_RANGE, AcceptanceStats
from vllm_lookahead.core.cost import BRANCH_PRIOR_WEIGHT, DECAY, KNEES, StepCost
from vllm_lookahead.core.sizing import choose_sizes, plan_step, score_floor
from vllm_lookahead.core.step_timer import StepTimer
from vllm_lookahead.core.tree import Candidate, Source, StepTree, build_step_tree


def _tree(scores: list[float]) -> StepTree:
    """A chain whose nodes after the root have these (non-increasing) scores."""
    return build_step_tree(0, None, [Candidate(list(range(1, len(scores) + 1)), scores, Source.LOOKUP)])


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


def _shrunk(price: float, steps: float, branched: float) -> float:
    """What a ridge of BRANCH_PRIOR_WEIGHT toward 0 leaves of a branch price measured by `branched` of `steps`
    (decayed weights): the indicator's information beside the intercept is its weighted variance."""
    info = branched - branched**2 / steps
    return price * info / (info + BRANCH_PRIOR_WEIGHT)


def test_step_cost_learns_its_terms_and_a_fixed_one_stays():
    """Requests, drafts and the branch price apart: a draft token is cheaper than a request (no attention over a
    long context of its own), and steps whose trees branch pay a price of their own. A straight line is fitted as
    one: no knee earns its parameters there."""
    cost = StepCost()
    rng = random.Random(0)
    steps = branched = 0.0  # the steps' and the branched steps' weights in the fit, as they decay
    for _ in range(600):
        r, d, b = rng.randint(1, 16), rng.randint(0, 40), rng.random() < 0.4
        cost.observe(r, d, b, 0.020 + 0.0015 * r + 0.0005 * d + 0.004 * b + rng.uniform(-0.0005, 0.0005))
        steps, branched = steps * DECAY + 1, branched * DECAY + b
    m = cost.coefficients()
    assert m.knee == 1 and m.per_draft == m.per_draft_below == pytest.approx(0.0005, rel=0.1)
    for r, d in ((1, 0), (1, 30), (8, 5), (16, 40)):
        assert cost.seconds(r, d) == pytest.approx(0.020 + 0.0015 * r + 0.0005 * d, rel=0.05)
        assert cost.marginal(r, d) == pytest.approx(0.0005, rel=0.1)
    # the price the branched steps measure, pulled toward the prior's 0 as BRANCH_PRIOR_WEIGHT more steps would
    assert m.branch == pytest.approx(_shrunk(0.004, steps, branched), rel=0.1)
    assert cost.seconds(4, 10, True) == pytest.approx(0.020 + 0.006 + 0.005 + 0.004, rel=0.05)
    frozen = StepCost(relative_node_cost=0.1)
    frozen.observe(10, 0, False, 5.0)
    assert frozen.coefficients() == (1.0, 0.0, 0.1, 0.0, 1, 0.1)
    assert frozen.seconds(3, 7) == pytest.approx(2.0)  # 1 + 0.1 per request or draft


def test_the_straight_line_predicts_the_seconds_it_was_fitted_to():
    """A token's price far from the prior's (here 4 ms of a 14 ms one-token step, the prior about 0.4 ms): the line
    reports one slope for both sides of its knee at 1, and its intercept keeps what the fit put on min(T, 1), so the
    seconds it predicts are the steps' own, down to the one-token step."""
    cost = StepCost()
    rng = random.Random(3)
    cost.observe(1, 0, False, 0.014)
    for _ in range(400):
        r, d = rng.randint(1, 16), rng.randint(0, 40)
        cost.observe(r, d, False, 0.010 + 0.004 * (r + d))
    m = cost.coefficients()
    assert m.knee == 1 and m.per_draft == m.per_draft_below == pytest.approx(0.004, rel=0.1)
    # (the slopes' ridge moves the line by a few percent; leaving the fit's share out would put the one-token step
    # near 0.018 s, a token's price above the fit's)
    for r, d in ((1, 0), (1, 5), (16, 0), (16, 40)):
        assert cost.seconds(r, d) == pytest.approx(0.010 + 0.004 * (r + d), rel=0.05)


def test_a_knee_the_steps_do_not_show_is_not_fitted():
    """Sixteen requests, a step dearer by a token's price for every token and noisy by 10%: whatever knee a fit
    puts in the noise does not earn its parameters, and the line's price holds on both sides of any knee (a knee
    at 16 tokens with a cheap slope below it would price the drafts of a draining batch at next to nothing)."""
    rng = random.Random(11)
    for _ in range(5):
        cost = StepCost()
        for _ in range(300):
            r = 16 if rng.random() < 0.8 else rng.randint(1, 15)
            d = rng.randint(0, 20)
            cost.observe(r, d, False, (0.035 + 0.0018 * (r + d)) * rng.uniform(0.9, 1.1))
        m = cost.coefficients()
        assert m.knee == 1 and m.per_draft == pytest.approx(0.0018, rel=0.3)


def test_a_knee_on_a_handful_of_steps_is_not_fitted():
    """Sixteen requests' steps on a line, then the first steps of a batch of 64, a few and a little slower than the
    line (a traced server's fit put a knee at 384 tokens on four such steps): a knee with only those few past it
    would price the large batch's drafts on next to no evidence. No knee lies past the many steps until a fair share
    of the steps lies on each side of it: a draft in the large batch costs about the line's price."""
    rng = random.Random(3)
    cost = StepCost()

    def line(r: int, d: int) -> float:
        return 0.035 + 0.0008 * r + 0.00045 * (r + d)

    for _ in range(300):
        r, d = rng.randint(12, 16), rng.randint(20, 100)
        cost.observe(r, d, True, line(r, d) * rng.uniform(0.95, 1.05))
    for _ in range(4):
        r, d = 64, rng.randint(350, 390)
        cost.observe(r, d, True, 1.25 * line(r, d))
    m = cost.coefficients()
    assert m.knee <= 100 and cost.marginal(64, 200) == pytest.approx(0.00045, rel=0.3)
    for _ in range(200):  # once the large steps are a fair share, their slope is measured and may differ
        r, d = 64, rng.randint(150, 390)
        cost.observe(r, d, True, 0.035 + 0.0008 * r + 0.00045 * 200 + 0.0009 * (r + d - 200))
    m = cost.coefficients()
    assert 96 <= m.knee <= 256 and m.per_draft == pytest.approx(0.0009, rel=0.3)


@pytest.mark.parametrize("seed", range(4))
def test_a_request_never_costs_less_than_a_draft_token(seed):
    """A large batch that seldom drafts: every step costs 1.2 ms a row, and the few steps that carry drafts run 8%
    slower by chance. The rows' price is what the many steps measure; left free, the split between a request and a
    draft rested on the few drafted steps and priced a draft at 1.5-1.8 ms and a request below nothing, so that the
    sizing drafted nothing. A request costs at least its own row's price: a draft is priced at the row's."""
    rng = random.Random(seed)
    cost = StepCost()
    for _ in range(300):
        r = 64 if rng.random() < 0.6 else rng.randint(1, 63)
        d = rng.randint(1, 12) if rng.random() < 0.06 else 0
        cost.observe(r, d, False, (0.016 + 0.0012 * (r + d)) * rng.uniform(0.93, 1.07) * (1.08 if d else 1.0))
    m = cost.coefficients()
    assert m.per_request >= 0
    assert cost.marginal(64, 0) == pytest.approx(0.0012, rel=0.1)
    assert cost.seconds(64, 0) == pytest.approx(0.016 + 0.0012 * 64, rel=0.05)


@pytest.mark.parametrize("knee", [4, 6, 12, 96])
def test_step_cost_finds_where_tokens_start_to_cost(knee):
    """A step bound by reading the weights costs about the same for a few tokens and then a price per token (this
    CPU at batch 1: flat to about 6 tokens, then about 1.3 ms a token; a GPU: flat to about a hundred). The fit finds
    the knee among KNEES, and the marginal price is the slope on each side of it (each pulled a little toward the
    prior's, most where few step sizes lie below the knee)."""
    cost = StepCost()
    rng = random.Random(knee)

    def truth(r: int, d: int) -> float:
        t = r + d
        return 0.030 + 0.0001 * min(t, knee) + 0.0013 * max(0, t - knee)

    for _ in range(800):
        r, d = rng.choice((1, 1, 1, 2, 4)), rng.randint(0, 2 * knee)
        cost.observe(r, d, False, truth(r, d) * rng.uniform(0.97, 1.03))
    m = cost.coefficients()
    assert m.knee in KNEES and abs(m.knee - knee) <= max(1, knee // 4)
    assert m.per_draft == pytest.approx(0.0013, rel=0.2) and m.per_draft_below < 0.5 * m.per_draft
    assert cost.marginal(1, 0) == m.per_draft_below and cost.marginal(1, 2 * knee) == m.per_draft
    for d in (0, knee // 2, knee, 2 * knee):
        assert cost.seconds(1, d) == pytest.approx(truth(1, d), rel=0.05)


def test_below_the_knee_trees_grow_and_past_it_each_node_pays_its_price():
    """Tokens that cost nothing up to the knee are taken whatever their score; past it a node must clear the bar
    that the price per token sets (p > yield * price / step)."""
    tree = _tree([0.9, 0.5, 0.2, 0.05, 0.04, 0.03, 0.02, 0.01])
    line = StepCost.frozen((0.030, 0.0, 0.0015, 0.0, 1, 0.0015))
    knee = StepCost.frozen((0.030, 0.0, 0.0015, 0.0, 6, 0.0))
    assert choose_sizes([tree], [100], 1, line, budget=100).sizes == [4]  # 0.05 * 0.0315 > 2.6 * 0.0015 no more
    assert choose_sizes([tree], [100], 1, knee, budget=100).sizes == [6]  # 5 drafts and the root: 6 tokens free
    # the bar where the first node is priced: below the knee nothing is too unlikely to draft
    assert score_floor(knee, 1) == 0.0 and score_floor(line, 1) > 0.0
    # sixteen requests are past the knee: the price applies from the first draft
    assert score_floor(knee, 16) == pytest.approx(16 * 0.0015 / knee.seconds(16, 0))


@settings(max_examples=100, deadline=None)
@given(
    knee=st.sampled_from([1, 3, 6, 16, 128]),
    below=st.sampled_from([0.0, 0.0002, 0.001]),
    requests=st.integers(1, 20),
    scores=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40),
)
def test_the_chosen_size_is_the_best_rate(knee, below, requests, scores):
    """The cost is convex in the drafts, so the node-by-node search stops at the size with the best expected
    tokens per second: no other size of the same best-first nodes does better."""
    tree = _tree(sorted(scores, reverse=True))
    cost = StepCost.frozen((0.03, 0.001, 0.002, 0.0, knee, below))
    chosen = choose_sizes([tree], [100], requests, cost, budget=100)
    rates = [(requests + sum(tree.scores[1:k])) / cost.seconds(requests, k - 1) for k in range(1, tree.num_nodes + 1)]
    assert chosen.rate == pytest.approx(max(rates), rel=1e-9)


def test_an_unmeasured_branch_price_decays_so_trees_are_tried_again():
    cost = StepCost()
    rng = random.Random(1)
    steps = branched = 0.0
    for _ in range(400):
        d, b = rng.randint(0, 7), rng.random() < 0.5
        cost.observe(1, d, b, 0.030 + 0.001 * d + 0.010 * b)
        steps, branched = steps * DECAY + 1, branched * DECAY + b
    assert cost.coefficients()[3] == pytest.approx(_shrunk(0.010, steps, branched), rel=0.1)
    for i in range(2000):  # only chains now: what the branch costs fades to the prior's 0
        cost.observe(1, i % 8, False, 0.030 + 0.001 * (i % 8))
    assert cost.coefficients()[3] < 0.001


def test_one_slow_branched_step_does_not_price_branching_out():
    """At a large batch trees seldom branch: one branched step slowed by the machine (46 ms over a 16-request step's
    cost) moves the price by at most 1 / (BRANCH_PRIOR_WEIGHT + 1) of its excess, below a draft token's cost, so
    trees still branch and the next branched steps measure it afresh."""
    cost = StepCost()
    rng = random.Random(5)

    def seconds(d: int) -> float:
        return 0.035 + 0.004 * 16 + 0.0027 * d + rng.uniform(-0.01, 0.01)

    for _ in range(150):
        d = rng.randint(0, 30)
        cost.observe(16, d, False, seconds(d))
    cost.observe(16, 31, True, seconds(31) + 0.046)
    per_draft, branch = cost.coefficients().per_draft, cost.coefficients().branch
    assert branch <= 0.046 / (BRANCH_PRIOR_WEIGHT + 1) + 0.001 and branch < per_draft
    for _ in range(60):  # then branched steps that cost what chains cost: the price returns toward 0
        d = rng.randint(0, 30)
        cost.observe(16, d, rng.random() < 0.5, seconds(d))
    assert cost.coefficients()[3] < 0.001


def test_sizes_follow_cost_and_scores():
    tree = _tree([0.9, 0.8, 0.5, 0.3, 0.1, 0.05, 0.02])
    free, dear = StepCost(relative_node_cost=0.0), StepCost(relative_node_cost=0.1)
    assert choose_sizes([tree], [100], 1, free, budget=100).sizes == [8]  # every node with a chance pays when free
    few = choose_sizes([tree], [100], 1, dear, budget=100).sizes[0]
    assert 1 < few < 8
    # dearer tokens, fewer nodes; more likely nodes, more nodes
    # a token as dear as a whole step: 0.9 and 0.8 still pay ((1 + 0.9) / 3 > 1 / 2, 2.7 / 4 > 1.9 / 3), 0.5 not
    assert choose_sizes([tree], [100], 1, StepCost(relative_node_cost=1.0), budget=100).sizes == [3]
    sure = _tree([0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.93])
    assert choose_sizes([sure], [100], 1, dear, budget=100).sizes[0] > few
    # caps and the budget hold
    assert choose_sizes([tree], [3], 1, free, budget=100).sizes == [3]
    assert choose_sizes([tree, sure], [100, 100], 2, free, budget=5).sizes == [1, 6]


def test_growing_step_cost_shrinks_trees_then_turns_drafting_off():
    """The measured line: as steps get dearer per token, trees shrink; a batch of many requests drafts nothing."""
    tree = _tree([0.6, 0.4, 0.3, 0.2, 0.1])
    sizes = []
    for slope in (0.001, 0.01, 0.05, 0.2):
        cost = StepCost()
        for t in (1, 10, 20, 30, 40) * 20:
            cost.observe(1, t - 1, False, 0.02 * (1 + slope * t))
        sizes.append(choose_sizes([tree], [100], 1, cost, budget=100).sizes[0])
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 6 and sizes[-1] < 6
    # 16 requests: a node must be likelier than 16 * 0.03 / (1 + 16 * 0.03) = 0.32 to pay
    cost = StepCost(relative_node_cost=0.03)
    assert choose_sizes([_tree([0.3, 0.2])] * 16, [100] * 16, 16, cost, budget=1000).sizes == [1] * 16
    assert choose_sizes([_tree([0.34, 0.2])] * 16, [100] * 16, 16, cost, budget=1000).sizes == [2] * 16


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
    sizes_full = choose_sizes(full, caps, batch, cost, budget=1000).sizes
    sizes_cut = choose_sizes(cut, caps, batch, cost, budget=1000).sizes
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
    worth 1 / 2.4 of itself, and the sizing takes fewer nodes. It starts at 1 and stays within its range."""
    tree = _tree([0.9, 0.6, 0.5, 0.4])
    stats = AcceptanceStats()
    assert stats.calibration == 1.0
    dear = StepCost(relative_node_cost=0.3)
    # trusted: 0.9, 0.6 and 0.5 pay (0.5 > 2.5 * 0.3 / 1.6), 0.4 not (3.0 * 0.3 / 1.9 = 0.47)
    assert choose_sizes([tree], [100], 1, dear, budget=100).sizes == [4]
    for _ in range(3000):
        stats.observe_carried(tree, [1])
    assert stats.calibration == pytest.approx(1 / 2.4, rel=0.02)
    # scaled: 0.375 pays, 0.25 not (1.375 * 0.3 / 1.3 = 0.32)
    assert choose_sizes([tree], [100], 1, dear, budget=100, scales=[stats.calibration]).sizes == [2]
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
        return choose_sizes([tree], [100], 1, cost, budget=100).sizes[0]

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


def test_the_straight_line_alone_when_the_knee_is_off(monkeypatch):
    monkeypatch.setenv("VLLM_LOOKAHEAD_COST_KNEE", "0")
    cost = StepCost()
    for d in [i % 20 for i in range(400)]:
        cost.observe(1, d, False, 0.030 + 0.0013 * max(0, d + 1 - 6))
    m = cost.coefficients()
    assert m.knee == 1 and m.per_draft_below == m.per_draft and 0.0005 < m.per_draft < 0.0013


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


def _timed(timer: StepTimer, trace) -> StepCost:
    """The trace's steps run through `timer` (back to back, drafting ending at each step's end) into a fit."""
    cost, now = StepCost(), 0.0
    for requests, drafts, branched, ms in trace:
        if (timed := timer.begin(now, requests, drafts)) is not None:
            cost.observe(*timed)
        timer.branched(bool(branched))
        now += ms / 1e3
        timer.end(now)
    if (timed := timer.begin(now, 4, None)) is not None:
        cost.observe(*timed)
    return cost


def test_an_engines_first_steps_do_not_make_drafts_look_free():
    """The engine's first COLD_STEPS complete steps are not timed: fitted, the traced cold ones make a step's cost
    flat up to a far knee, every draft below it free; without them the fit is a line at about the later steps'
    0.43 ms a token."""
    from vllm_lookahead.core.step_timer import COLD_STEPS, cold_steps

    assert cold_steps() == COLD_STEPS >= 3
    everything = _timed(StepTimer(cold=0), COLD_TRACE).coefficients()
    assert everything.knee >= 32 and everything.marginal(4, 24) == 0.0
    timer = StepTimer(cold=COLD_STEPS)
    warm = _timed(timer, COLD_TRACE).coefficients()
    assert timer.timed == len(COLD_TRACE) - COLD_STEPS and timer.cold == 0
    assert warm.knee == 1 and 0.0002 < warm.marginal(4, 24) < 0.0006


def test_a_settled_fit_is_solved_again_every_few_steps():
    from vllm_lookahead.core.cost import RESOLVE_EVERY, SETTLED

    cost = StepCost()
    i = 0
    while cost._n < SETTLED:
        cost.observe(1 + i % 8, i % 24, False, 0.030 + 0.001 * (1 + i % 8) + 0.0002 * (i % 24))
        i += 1
    fit = cost.coefficients()
    for j in range(RESOLVE_EVERY - 1):  # steps twice as slow: the fit waits
        cost.observe(4, j, False, 0.1)
        assert cost.coefficients() is fit
    cost.observe(4, 0, False, 0.1)
    assert cost.coefficients().fixed > fit.fixed  # and then follows them


def test_steps_folded_into_the_fit_a_few_at_a_time_weigh_as_if_added_one_by_one():
    """`StepCost.observe` defers its sums to the next solve; each step still weighs DECAY per step observed after it."""
    import numpy as np

    cost, rng = StepCost(), random.Random(3)
    steps = [(rng.randint(1, 16), rng.randint(0, 40), rng.random() < 0.3, 0.01 + rng.random() * 0.03) for _ in range(9)]
    for step in steps:
        cost.observe(*step)
    cost.coefficients()  # folds
    k = np.array(KNEES, dtype=float)
    xtx, xty, beyond = np.zeros((len(k), 5, 5)), np.zeros((len(k), 5)), np.zeros(len(k))
    for age, (r, d, b, y) in enumerate(reversed(steps)):
        t = r + d
        x = np.stack([k * 0 + 1, k * 0 + r, np.minimum(t, k), np.maximum(0.0, t - k), k * 0 + b], 1)
        xtx += DECAY**age * x[:, :, None] * x[:, None, :]
        xty += DECAY**age * x * y
        beyond += DECAY**age * (t > k)
    assert np.allclose(cost._xtx, xtx) and np.allclose(cost._xty, xty) and np.allclose(cost._beyond, beyond)
    assert cost._yy == pytest.approx(sum(DECAY**age * y * y for age, (*_, y) in enumerate(reversed(steps))))
