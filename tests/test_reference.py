"""The transformers reference decoder: exact greedy output, fewer forward passes than tokens."""

from __future__ import annotations

import pytest
import torch

from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.devtools.prompts import humaneval_prompts
from vllm_lookahead.devtools.reference_decoder import lookahead_generate

MAX_NEW = 64


@pytest.fixture(scope="module")
def hf(model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    return model, tok


@pytest.fixture(scope="module")
def cases(hf):
    """Three HumanEval prompts with their plain greedy continuations (the ground truth)."""
    model, tok = hf
    out = []
    for prompt in humaneval_prompts(3):
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            ref = model.generate(ids, do_sample=False, max_new_tokens=MAX_NEW)[0, ids.shape[1] :].tolist()
        out.append((ids, ref))
    return out


def test_greedy_equals_generate_and_compresses(hf, cases):
    model, _ = hf
    total_tokens = total_steps = 0
    params = LookaheadParams(window_size=7, ngram_size=4, guess_set_size=7)
    for ids, ref in cases:
        new, stats = lookahead_generate(model, ids, MAX_NEW, params)
        assert new == ref
        assert stats["tokens"] == len(new)
        # Every step is one forward pass and yields 1 + accepted tokens (the last step may overshoot).
        assert stats["steps"] + stats["accepted"] >= len(new)
        total_tokens += len(new)
        total_steps += stats["steps"]
    assert total_tokens / total_steps > 1.3


@pytest.mark.parametrize(("w", "n", "g", "max_nodes"), [(1, 2, 0, None), (4, 3, 2, None), (8, 5, 8, 12)])
def test_other_shapes_and_truncated_trees_stay_exact(hf, cases, w, n, g, max_nodes):
    model, _ = hf
    ids, ref = cases[0]
    params = LookaheadParams(
        window_size=w, ngram_size=n, guess_set_size=g, lookup_candidates=0, suffix_candidates=0, recycle_candidates=0
    )
    new, stats = lookahead_generate(model, ids, MAX_NEW, params, max_nodes=max_nodes)
    assert new == ref
    if g == 0 and w == 1:
        # A window of one column on a 2-gram holds only x0 and there is no pool, lookup, suffix or recycling: plain
        # decoding.
        assert stats["steps"] == len(new)


def test_eos_and_length_limit(hf, cases):
    model, _ = hf
    ids, ref = cases[0]
    new, _ = lookahead_generate(model, ids, 5)
    assert new == ref[:5]
    # Treat the 10th reference token as EOS: output stops right after it, as generate would.
    new, _ = lookahead_generate(model, ids, MAX_NEW, eos_token_id=ref[9])
    assert new == ref[: ref.index(ref[9]) + 1]


def test_sampling_runs_and_is_seeded(hf, cases):
    model, _ = hf
    ids, _ = cases[1]
    params = LookaheadParams(lookahead_seed=3)
    a, _ = lookahead_generate(model, ids, 24, params, do_sample=True, temperature=0.8)
    b, _ = lookahead_generate(model, ids, 24, params, do_sample=True, temperature=0.8)
    assert a == b and len(a) == 24
