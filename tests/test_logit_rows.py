"""The target's argmax and top tokens over logits rows (`backends/logit_rows.py`, `backends/cpu/logit_rows.py`): the
compiled library's and torch's paths give vLLM's greedy argmax and torch's top k."""

from __future__ import annotations

import pytest
import torch

from vllm_lookahead.backends.cpu import library
from vllm_lookahead.backends.cpu.logit_rows import CompiledRows
from vllm_lookahead.backends.logit_rows import LogitRows

needs_library = pytest.mark.skipif(library.load() is None, reason="the compiled CPU library does not build here")


@pytest.fixture(params=["library", "torch"])
def path(request):
    """Each test runs through the compiled library and through torch's path."""
    if request.param == "library" and library.load() is None:
        pytest.skip("the compiled CPU library does not build here")
    return request.param


def _rows(path: str) -> LogitRows:
    return CompiledRows(library.load()) if path == "library" else LogitRows()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_takes_the_argmax_vllm_greedy_sampling_takes(dtype, path):
    """Ties go to the first maximal index and NaN counts as the largest, as in vLLM's `argmax(-1)` of the float32
    logits; rows are read as they are laid out (a transposed view too), and a subset of rows in the order asked."""
    picks = _rows(path)
    g = torch.Generator().manual_seed(0)
    logits = torch.randint(-3, 4, (40, 257), generator=g).to(dtype)  # few distinct values: ties in every row
    logits[5, 100] = float("nan")
    logits[5, 200] = float("nan")
    logits[6, :] = float("-inf")
    logits[7, 3] = logits[7, 200] = 1000.0
    logits[8, 250] = float("inf")
    logits[8, 251] = float("nan")  # NaN above +inf
    expected = logits.to(torch.float32).argmax(-1).tolist()
    assert picks.argmax(logits) == expected
    assert expected[5] == 100 and expected[6] == 0 and expected[7] == 3 and expected[8] == 251
    view = logits.t().contiguous().t()
    assert not view.is_contiguous() and picks.argmax(view) == expected
    rows = [7, 0, 39, 5, 7]
    assert picks.argmax(logits, rows) == [expected[r] for r in rows]
    assert picks.argmax(logits, rows[:2]) == [expected[r] for r in rows[:2]]  # few rows: gathered without the library
    assert picks.argmax(logits, []) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [50, 1000, 4096, 49152 + 7, 151936])
def test_topk_is_each_rows_top_k(dtype, vocab, path):
    """What torch's topk gives: the k largest of each row, largest first (compared by value: bfloat16 rows tie often,
    and then either tied token is right), of every row or of the rows asked for, from a matrix whose rows are wider
    than the vocabulary (a column slice)."""
    picks = _rows(path)
    gen = torch.Generator().manual_seed(vocab)
    for n in (2, 5, 9):  # torch's own topk for a few rows, the blocks for more; the library's threads from 8
        wide = torch.randn(n, vocab + 3, generator=gen).to(dtype)
        rows = wide[:, :vocab]
        rows[1, 7] = 50.0  # one block holding several of a row's best
        rows[1, 8] = 40.0
        rows[1, 9] = 30.0
        rows[0, -1] = 60.0  # the last entry, past the last whole vector
        for k in (1, 8, 40):
            got = picks.topk(rows, k)
            want = rows.topk(k, dim=-1).values
            assert [len(r) for r in got] == [k] * n
            assert all(len(set(r)) == k for r in got)
            assert torch.equal(torch.stack([rows[i, got[i]] for i in range(n)]), want)
        assert picks.topk(rows, 8)[1][:3] == [7, 8, 9]
        assert picks.topk(rows, 8)[0][0] == vocab - 1
        picked = picks.topk(rows, 8, [1, 0])
        assert torch.equal(rows[1, picked[0]], rows[1].topk(8).values)
        assert torch.equal(rows[0, picked[1]], rows[0].topk(8).values)
        if path == "library":  # ties in index order, whichever rows are read
            assert picked == [picks.topk(rows, 8)[1], picks.topk(rows, 8)[0]]


def test_topk_orders_ties_by_index_and_nan_first(path):
    """Equal values keep the lower index first (k = 1 is the argmax), NaN comes before every number."""
    picks = _rows(path)
    rows = torch.zeros(2, 300)
    rows[0, [5, 250, 17]] = 2.0
    rows[1, 100] = float("nan")
    rows[1, 3] = float("inf")
    got = picks.topk(rows, 4)
    if path == "library":
        assert got[0] == [5, 17, 250, 0]
    else:  # torch's topk orders ties as it likes
        assert sorted(got[0][:3]) == [5, 17, 250]
    assert got[1][:2] == [100, 3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pick_reads_the_argmax_and_the_top_tokens_together(dtype, path):
    """`pick`: each row's argmax as `argmax` takes it (ties as vLLM's), with its top k where k > 0 (the
    library reads each row once: the argmax is the first of its top k)."""
    picks = _rows(path)
    g = torch.Generator().manual_seed(2)
    logits = torch.randint(-3, 4, (30, 300), generator=g).to(dtype)  # ties in every row
    rows = [4, 3, 29, 0]
    for asked in (None, rows):
        argmax = picks.argmax(logits, asked)
        only = picks.pick(logits, asked)
        assert only.argmax == argmax and only.top is None
        both = picks.pick(logits, asked, 8)
        assert both.argmax == argmax
        assert both.top is not None and [len(t) for t in both.top] == [8] * len(argmax)
        want = logits if asked is None else logits[asked]
        assert torch.equal(torch.stack([want[i, t] for i, t in enumerate(both.top)]), want.topk(8).values)


@needs_library
def test_the_librarys_top_k_refuses_what_it_cannot_read():
    """A k outside 1..min(columns, max_k), rows outside the matrix, a dtype or a layout it does not read: an error,
    not a read out of bounds."""
    lib = library.load()
    m = torch.zeros(3, 10)
    for matrix, k in ((m, 0), (m, 11), (torch.zeros(3, lib.max_k + 5), lib.max_k + 1)):
        with pytest.raises(ValueError, match="outside"):
            lib.top_k(matrix, k)
    with pytest.raises(ValueError, match="outside the matrix"):
        lib.top_k(m, 1, [0, 3])
    with pytest.raises(ValueError, match="takes CPU"):
        lib.top_k(m.to(torch.float16), 1)
    with pytest.raises(ValueError, match="takes CPU"):
        lib.top_k(m.t(), 1)
    assert lib.top_k(m, 2, []).shape == (0, 2)
