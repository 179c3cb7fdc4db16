import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_lookahead.core.window import JacobiWindow


def window_slots(win: JacobiWindow) -> list[tuple[int, int, int]]:
    """All (row, col, token), (0, 0) included, column-major: parents before children (the parent of (r, i) is
    (r-1, i), or (0, i-1) for row 0), and a prefix of it keeps whole leading columns, exactly the slots whose outputs
    give complete n-grams."""
    rows = win.rows
    return [(r, i, rows[r][i]) for i in range(len(rows[0])) for r in range(len(rows))]


def _labelled_window(w, n, p):
    """Every token is the position it stands for: row 0 = [p, p+1, ...]."""
    return JacobiWindow(w, n, [p + j for j in range(1, w + n - 2)], x0=p)


def _perfect_outputs(win, p):
    """The prediction made at last-row slot (k, i) is for position p + k + i + 1."""
    k = win.fill
    return [p + k + i + 1 for i in range(win.num_cols)]


def test_initial_shape_and_from_tokens():
    win = JacobiWindow.from_tokens(4, 3, [7, 8, 9], random.Random(1), x0=5)
    assert win.rows[0][0] == 5
    assert len(win.rows) == 1 and win.num_cols == 4 + 3 - 2
    assert set(win.rows[0][1:]) <= {7, 8, 9}
    assert not (win.fill == win.ngram_size - 2)
    again = JacobiWindow.from_tokens(4, 3, [7, 8, 9], random.Random(1), x0=5)
    assert again.rows == win.rows  # seeded: reproducible
    rows = {tuple(JacobiWindow.from_tokens(6, 4, range(100), random.Random(s)).rows[0]) for s in range(5)}
    assert len(rows) > 1  # but the seed matters


def test_empty_source_falls_back():
    win = JacobiWindow.from_tokens(3, 3, [], random.Random(0), x0=4)
    assert win.rows == [[4, 4, 4, 4]]
    assert JacobiWindow.from_tokens(2, 2, [], random.Random(0)).rows[0][1:] == [0]


def test_wrong_guess_count_and_output_length():
    with pytest.raises(ValueError, match="needs 4 guesses"):
        JacobiWindow(3, 4, [1, 2, 3])
    win = JacobiWindow(3, 4, [1, 2, 3, 4])
    with pytest.raises(ValueError, match="expected 5 window outputs"):
        win.step(0, [1, 2, 3, 4])


def test_n2_steady_from_start_row0_from_outputs():
    win = JacobiWindow(4, 2, [11, 12, 13], x0=10)
    assert (win.fill == win.ngram_size - 2) and len(win.rows) == 1
    ngrams = win.step(20, [21, 22, 23, 24])
    assert ngrams == [(10, (21,)), (11, (22,)), (12, (23,)), (13, (24,))]
    assert win.rows == [[20, 22, 23, 24]]


def test_concrete_warmup_then_steady_n4():
    win = JacobiWindow(2, 4, [1, 2, 3], x0=0)  # row 0: 2 + 2 columns
    assert win.step(10, [1, 2, 3, 4]) == []  # warm-up 1: no pool update
    assert win.rows == [[10, 2, 3], [2, 3, 4]]
    assert win.step(20, [0, 0, 0]) == []  # warm-up 2: only the last row's outputs matter
    assert win.rows == [[20, 3], [3, 4], [0, 0]]
    assert win.fill == win.ngram_size - 2
    win.set_x0(30)
    ngrams = win.step(40, [7, 8])
    assert ngrams == [(30, (3, 0, 7)), (3, (4, 0, 8))]
    assert win.rows == [[40, 4], [0, 0], [7, 8]]


@settings(max_examples=150, deadline=None)
@given(w=st.integers(1, 8), n=st.integers(2, 7), steps=st.integers(0, 12), p0=st.integers(0, 1000))
def test_position_rule_shapes_and_ngrams(w, n, steps, p0):
    # Tokens are labelled by the position they stand for; with perfect outputs every slot (r, i) must hold
    # p + r + i at every step, warm-up and steady state alike, and every n-gram must be a consecutive run.
    win = _labelled_window(w, n, p0)
    p = p0
    for s in range(steps + 1):
        k = min(s, n - 2)
        assert win.fill == k
        assert (win.fill == win.ngram_size - 2) == (k == n - 2)
        assert len(win.rows) == k + 1
        assert all(len(row) == (w if k == n - 2 else w + n - 2 - k) for row in win.rows)
        for r, i, tok in window_slots(win):
            assert tok == p + r + i
        if s == steps:
            break
        ngrams = win.step(p + 1, _perfect_outputs(win, p))
        if k < n - 2:
            assert ngrams == []
        else:
            assert ngrams == [(p + i, tuple(range(p + i + 1, p + i + n))) for i in range(w)]
        p += 1


@settings(max_examples=100, deadline=None)
@given(w=st.integers(1, 6), n=st.integers(2, 6), steps=st.integers(0, 6))
def test_slots_parents_first_column_major(w, n, steps):
    win = _labelled_window(w, n, 0)
    for p in range(steps):
        win.step(p + 1, _perfect_outputs(win, p))
    slots = window_slots(win)
    seen = set()
    for r, i, tok in slots:
        assert tok == win.rows[r][i]
        if (r, i) != (0, 0):
            assert ((r - 1, i) if r else (0, i - 1)) in seen
        seen.add((r, i))
    assert len(seen) == len(slots) == len(win.rows) * win.num_cols
    assert [(r, i) for r, i, _ in slots] == sorted(seen, key=lambda s: (s[1], s[0]))


@pytest.mark.parametrize("n", [2, 3, 5])
def test_missing_outputs_keep_old_guess_and_skip_ngram(n):
    w = 4
    win = _labelled_window(w, n, 0)
    p = 0
    while not (win.fill == win.ngram_size - 2):
        win.step(p + 1, _perfect_outputs(win, p))
        p += 1
    old_last = list(win.rows[-1])
    outs = _perfect_outputs(win, p)
    outs[1] = None
    outs[3] = None
    ngrams = win.step(p + 1, outs)
    assert [key for key, _ in ngrams] == [p, p + 2]  # columns 1 and 3 teach the pool nothing
    new_last = win.rows[-1]
    if n > 2:
        assert new_last[1] == old_last[2]  # old guess for the same position
        assert new_last[3] == old_last[3]  # last column: old row's last token
    else:
        assert win.rows[0][1] == old_last[2]
        assert win.rows[0][3] == old_last[3]


def test_missing_outputs_during_warmup():
    win = _labelled_window(3, 4, 0)  # row 0 has 5 columns
    win.step(1, [1, None, 3, None, None])
    # new row 1 = outputs[1:], None -> old row 0 token one column right (same position) or its last token
    assert win.rows[1] == [2, 3, 4, 4]
