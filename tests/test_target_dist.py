"""A sampled request's draw at a tree node: the nucleus found without sorting the whole row is the one vLLM's
top-k / top-p masking keeps, an unseeded draw samples it in the right proportions, and a seeded draw keeps vLLM's
own path (its generator then gives plain decoding's tokens)."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch

from vllm_lookahead.glue import target_dist
from vllm_lookahead.glue.target_dist import NUCLEUS_SEARCH, draw, nucleus

VOCAB = 49152  # the default model's


def _vllm_kept(row: torch.Tensor, k: int | None, p: float) -> set[int]:
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    masked = apply_top_k_top_p(row.clone().unsqueeze(0), None if k is None else torch.tensor([k]), torch.tensor([p]))
    return set(torch.nonzero(torch.isfinite(masked[0])).flatten().tolist())


def _rows() -> list[torch.Tensor]:
    """Peaked and flat rows, one with a few dominant tokens, one with ties at the top-k edge, one with -inf (min-p)."""
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(VOCAB, generator=g) * s for s in (2.0, 4.0, 6.0, 8.0, 12.0)]
    lead = torch.randn(VOCAB, generator=g)
    lead[[3, 70, 900, 4000]] += torch.tensor([9.0, 8.5, 8.0, 7.0])
    rows.append(lead)
    ties = torch.randn(VOCAB, generator=g) * 4
    top = ties.topk(5).values
    ties[ties.topk(40).indices[5:40]] = top[4]  # 36 tokens tie with the 5th largest
    rows.append(ties)
    masked = torch.randn(VOCAB, generator=g) * 6
    masked[masked < 0] = -float("inf")
    rows.append(masked)
    return rows


@pytest.mark.parametrize("k", [None, 5, 50, 100, 2000, VOCAB])
@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
def test_nucleus_keeps_what_vllms_top_k_top_p_keeps(k, p):
    looked = 0
    for row in _rows():
        found = nucleus(row, k, p)
        want = _vllm_kept(row, k, p)
        if found is None:  # only where the nucleus is wider than the search, or the cut splits tied tokens
            cut = min(row[list(want)])
            split = bool((row == cut).sum() > sum(1 for t in want if row[t] == cut))
            assert split or (k in (None, VOCAB) and len(want) > NUCLEUS_SEARCH[-1])
            continue
        idx, vals = found
        looked += 1
        assert set(idx.tolist()) == want
        assert torch.equal(vals, row[idx])
        assert bool((vals[:-1] >= vals[1:]).all())  # best first
    assert looked >= 4


def test_nucleus_top_k_past_the_finite_logits_masks_nothing():
    """With fewer finite logits than k (min-p masked the rest), vLLM's top-k keeps every token, as without top-k."""
    row = _rows()[-1]  # about half the row is -inf
    assert int(torch.isfinite(row).sum()) < 30000
    for p in (0.5, 0.9):
        idx, _ = nucleus(row, 30000, p)
        assert set(idx.tolist()) == _vllm_kept(row, 30000, p) == set(nucleus(row, None, p)[0].tolist())


def test_nucleus_gives_way_on_nan():
    row = _rows()[2].clone()
    row[17] = float("nan")
    assert nucleus(row, None, 0.9) is None and nucleus(row, 50, 0.9) is None


def test_nucleus_keeps_every_token_tied_with_the_kth():
    row = _rows()[6]
    idx, _ = nucleus(row, 5, 0.999)
    assert len(idx) == 40 and set(idx.tolist()) == _vllm_kept(row, 5, 0.999)


@pytest.mark.parametrize("k", [5, 1500])
def test_nucleus_follows_ties_with_the_kth_past_its_first_search(k):
    """Ties with the k-th largest that reach past the tokens first looked at: vLLM keeps them all, so the search
    widens (k 5: 64 then 1024 tokens) or gives way (k 1500: no wider search)."""
    row = torch.randn(VOCAB, generator=torch.Generator().manual_seed(4)) * 4
    order = row.topk(k + 200).indices
    row[order[k - 1 : k + 199]] = float(row[order[k - 1]])  # 200 tokens tie with the k-th
    found = nucleus(row, k, 0.999)
    if k == 5:
        idx, _ = found
        assert len(idx) == k + 199 and set(idx.tolist()) == _vllm_kept(row, k, 0.999)
    else:
        assert found is None


def test_nucleus_returns_a_whole_small_row():
    row = torch.tensor([3.0, 1.0, 0.5, 0.25, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0])
    idx, _ = nucleus(row, None, 0.9999)
    assert set(idx.tolist()) == _vllm_kept(row, None, 0.9999) and len(idx) >= 9


def test_nucleus_widens_its_search_for_a_wide_nucleus():
    row = _rows()[1]  # x4: a nucleus of a few hundred tokens at top-p 0.9
    want = _vllm_kept(row, None, 0.9)
    assert NUCLEUS_SEARCH[0] < len(want) < NUCLEUS_SEARCH[-1]
    idx, _ = nucleus(row, None, 0.9)
    assert set(idx.tolist()) == want


def test_nucleus_leaves_a_cut_through_tied_tokens_to_vllm():
    """Which of several tied tokens vLLM's top-p keeps depends on how its sort orders ties: no set by value is it."""
    row = _rows()[6]  # 36 tokens tie with the 5th largest
    want = _vllm_kept(row, None, 0.5)
    tied = set(torch.nonzero(row == row.topk(5).values[4]).flatten().tolist())
    assert 0 < len(tied & want) < len(tied)  # vLLM's cut splits them
    assert nucleus(row, None, 0.5) is None


def test_nucleus_falls_back_only_past_its_search():
    flat = torch.zeros(VOCAB)  # every token equally likely: the nucleus holds 90% of the vocabulary
    assert nucleus(flat, None, 0.9) is None
    small = torch.randn(300, generator=torch.Generator().manual_seed(1))  # the whole row fits the search
    idx, _ = nucleus(small, None, 0.9)
    assert set(idx.tolist()) == _vllm_kept(small, None, 0.9)


def _metadata(row_count: int, temperature: float, top_p: float | None, top_k: int | None, generators: dict):
    return SimpleNamespace(
        temperature=torch.full((row_count,), temperature),
        top_p=None if top_p is None else torch.full((row_count,), top_p),
        top_k=None if top_k is None else torch.full((row_count,), top_k, dtype=torch.int32),
        generators=generators,
        logitsprocs=SimpleNamespace(argmax_invariant=[]),
    )


def _sampler():
    from vllm.v1.sample.sampler import Sampler

    return Sampler()


def test_unseeded_draw_samples_the_nucleus_in_its_proportions():
    from scipy.stats import chisquare

    row = torch.full((VOCAB,), -30.0)
    logits = torch.tensor([3.0, 2.5, 2.0, 1.0, 0.0])
    row[[11, 222, 3333, 44, 5]] = logits
    md = _metadata(1, 1.0, 0.9, None, {})
    idx, vals = nucleus(row, None, 0.9)
    want = torch.softmax(vals.double(), 0)  # renormalised over the nucleus, as vLLM samples after masking
    counts = dict.fromkeys(idx.tolist(), 0)
    torch.manual_seed(0)
    n = 4000
    sampler = _sampler()
    for _ in range(n):
        tok = draw(sampler, row, md, 0)
        assert tok in counts  # never outside the nucleus
        counts[tok] += 1
    observed = [counts[t] for t in idx.tolist()]
    assert chisquare(observed, (want * n).tolist()).pvalue > 1e-3
    assert len(idx) < 5  # the last tokens fall outside top-p 0.9


def test_unseeded_draw_with_top_k_stays_in_the_top_k_nucleus(monkeypatch):
    row = torch.randn(VOCAB, generator=torch.Generator().manual_seed(3)) * 6
    md = _metadata(1, 0.7, 0.95, 3, {})
    idx, _ = nucleus(target_dist.processed_logits(row, md, 0)[0], 3, 0.95)
    assert 1 < len(idx) <= 3
    found = []

    def spy(*a):
        out = nucleus(*a)
        found.append(out)
        return out

    monkeypatch.setattr(target_dist, "nucleus", spy)
    sampler = _sampler()
    torch.manual_seed(1)
    seen = {draw(sampler, row, md, 0) for _ in range(300)}
    assert seen == set(idx.tolist())
    assert len(found) == 300 and all(f is not None for f in found)  # the nucleus path drew them, not vLLM's


def test_seeded_draw_takes_vllms_path(monkeypatch):
    """A seeded request never uses the nucleus search: its draw is vLLM's sampler's, from its generator."""

    def refuse(*_a, **_k):
        raise AssertionError("nucleus used for a seeded request")

    monkeypatch.setattr(target_dist, "nucleus", refuse)
    sampler = _sampler()
    gen = torch.Generator().manual_seed(0)
    for seed in range(20):
        row = torch.randn(VOCAB, generator=gen) * 4
        mine = draw(sampler, row, _metadata(1, 0.7, 0.9, None, {0: torch.Generator().manual_seed(seed)}), 0)
        logits = target_dist.processed_logits(row, _metadata(1, 0.7, 0.9, None, {}), 0)
        theirs, _ = sampler.topk_topp_sampler(
            logits, {0: torch.Generator().manual_seed(seed)}, None, torch.tensor([0.9])
        )
        assert mine == int(theirs[0])
    called = []
    monkeypatch.setattr(target_dist, "nucleus", lambda *a: called.append(a) or None)
    draw(sampler, row, _metadata(1, 0.7, 0.9, None, {}), 0)
    assert called  # an unseeded one with top-p looks for the nucleus (None: it falls back to vLLM's path)


# --- every node drawn at once (a GPU's path, `draw_trees`) ------------------------------------------------------------


def _walk_tree(rows: torch.Tensor, seed: int):
    """A 24-node tree whose nodes carry their parent row's likelier tokens (so walks go deep), random parents."""
    from vllm_lookahead.core.tree import StepTree

    rng = torch.Generator().manual_seed(seed)
    tokens, parents, depths = [int(rows[0].argmax())], [-1], [0]
    for u in range(1, rows.shape[0]):
        parent = int(torch.randint(0, u, (1,), generator=rng))
        likely = rows[parent].topk(3).indices
        tokens.append(int(likely[int(torch.randint(0, 3, (1,), generator=rng))]))
        parents.append(parent)
        depths.append(depths[parent] + 1)
    return StepTree(tokens=tokens, parents=parents, depths=depths)


@pytest.mark.parametrize("path", ["cpu", "native"])
@pytest.mark.parametrize("x0_drawn", [True, False])
def test_batched_draws_give_seeded_walks_the_tokens_and_generators_of_walking(path: str, x0_drawn: bool):
    """`draw_trees` (every node at once, one copy) against the walk that draws at each visited node (`draw_at`):
    seeded requests get the same tokens and leave their generators in the same state, through vLLM's CPU sampler
    and through its GPU path (`forward_native`), with top-k and top-p."""
    from vllm_lookahead.core.verify import draw_verify

    sampler = _sampler()
    if path == "native":
        sampler.topk_topp_sampler.forward = sampler.topk_topp_sampler.forward_native
    vocab, n, reqs = 64, 24, 3
    walked = 0
    for seed in range(6):
        logits = torch.randn(reqs * n, vocab, generator=torch.Generator().manual_seed(seed)) * 4
        trees = [_walk_tree(logits[i * n : (i + 1) * n], seed * 10 + i) for i in range(reqs)]
        x0 = torch.tensor([int(logits[i * n].argmax()) for i in range(reqs)])
        md_walk, md_batch = (
            _metadata(reqs, 0.8, 0.95, 20, {i: torch.Generator().manual_seed(100 * seed + i) for i in range(reqs)})
            for _ in range(2)
        )
        batch = SimpleNamespace(sampling_metadata=md_batch)
        spans = [(i, i * n, tree) for i, tree in enumerate(trees)]
        draws = target_dist.draw_trees(sampler, batch, logits, spans, x0 if x0_drawn else None)
        for i, tree in enumerate(trees):
            rows = logits[i * n : (i + 1) * n]
            first = int(x0[i]) if x0_drawn else None
            want = draw_verify(tree, partial(target_dist.draw_at, sampler, md_walk, i, rows, first))
            got = draw_verify(tree, draws.draws[i].__getitem__)
            draws.consumed(i, len(got[1]))
            assert got == want, (seed, i)
            assert torch.equal(md_batch.generators[i].get_state(), md_walk.generators[i].get_state()), (seed, i)
            walked += len(want[1]) - 1
    assert walked >= 12  # the walks went past their roots (a token below x0 for two walks in three)


def test_batched_unseeded_draws_sample_each_nodes_distribution():
    """An unseeded node's batched draw follows the target's distribution after temperature, top-k and top-p."""
    from scipy.stats import chisquare

    from vllm_lookahead.core.tree import StepTree

    sampler = _sampler()
    sampler.topk_topp_sampler.forward = sampler.topk_topp_sampler.forward_native
    row = torch.full((64,), -30.0)
    row[[3, 7, 11, 19, 23]] = torch.tensor([2.0, 1.6, 1.2, 0.5, 0.0])
    logits = torch.stack([row, row.roll(5)])  # the root's row, then node 1's
    tree = StepTree(tokens=[0, 3], parents=[-1, 0], depths=[0, 1])
    md = _metadata(1, 0.9, 0.9, 4, {})
    batch = SimpleNamespace(sampling_metadata=md)
    torch.manual_seed(0)
    n = 3000
    counts = {}
    for _ in range(n):
        t = target_dist.draw_trees(sampler, batch, logits, [(0, 0, tree)], torch.tensor([3])).draws[0][1]
        counts[t] = counts.get(t, 0) + 1
    kept = [8, 12, 16, 24]  # node 1's top 4 (top-k), all inside top-p 0.9
    probs = torch.softmax(row[[3, 7, 11, 19]].double() / 0.9, 0)
    cut = int((torch.cumsum(probs, 0) - probs < 0.9).sum())  # vLLM's top-p over the top-k tokens
    want = torch.softmax(row[[3, 7, 11, 19]][:cut].double() / 0.9, 0)
    assert set(counts) == set(kept[:cut]), counts
    assert chisquare([counts[t] for t in kept[:cut]], (want * n).tolist()).pvalue > 1e-3
