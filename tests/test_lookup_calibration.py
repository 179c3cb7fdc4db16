"""The prompt-lookup calibration benchmark (`benchmarks/lookup_calibration.py`), on synthetic outputs."""

from __future__ import annotations

import json

import pytest

from benchmarks.lookup_calibration import calibrate, main


def test_a_long_repeat_is_counted_right_and_a_short_match_that_misleads_wrong():
    # output copies a 20-token run of the prompt: once past the first tokens, every guess continues the copy
    run = list(range(100, 120))
    table = calibrate([(run, run)])
    n_long, right_long = table[("matched", "16")]
    assert n_long > 0 and right_long == n_long
    # "7" always followed by something new: the 1-token match guesses what followed it last time, never right
    seq = [7, 1, 7, 2, 7, 3, 7, 4, 7, 5]
    table = calibrate([(seq[:2], seq[2:])])
    n_short, right_short = table[("matched", "1")]
    assert n_short >= 3 and right_short == 0
    assert sum(n for (by, _), (n, _) in table.items() if by == "agree") == sum(
        n for (by, _), (n, _) in table.items() if by == "matched"
    )


def test_every_candidate_is_classed_by_the_suffix_speculation_beside_it():
    pytest.importorskip("arctic_inference")
    run = list(range(100, 120))
    table = calibrate([(run, run), ([7, 1], [7, 2, 7, 3, 7, 4, 7, 5])])
    counted = sum(n for (by, _), (n, _) in table.items() if by == "matched")
    assert sum(n for (by, _), (n, _) in table.items() if by == "suffix") == counted
    n, right = table[("suffix", "offers it")]  # the copied run: the suffix tree continues it as lookup does
    assert n > 0 and right > 0
    assert ("suffix", "offers it") not in calibrate([(run, run)], with_suffix=False)


def test_main_prints_a_row_per_bucket(tmp_path, capsys):
    path = tmp_path / "seqs.json"
    run = list(range(100, 120))
    path.write_text(json.dumps({"humaneval": [[run, run, []]]}))
    assert main(["--sequences", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| humaneval | matched | 16 |" in out and "| humaneval | agree | all |" in out
    assert main(["--sequences", str(tmp_path / "missing.json")]) == 2
