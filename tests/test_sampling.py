"""Sampling through the tree keeps vLLM's sampling distribution (real engine, default model, float32).

For three sampling settings, each on one of two prompts, 1,200 unseeded lookahead samples and as many plain samples of
the first tokens are compared with a two-sample chi-square test; the test fails when the distributions
differ (p < 0.001). Lookahead must also have verified those samples on trees (tokens per forward > 1). (Seeded
requests are checked token for token against plain decoding in test_engine_lookahead.py.)

The larger version (a benchmark, not run by `make test`):
LOOKAHEAD_SAMPLES=20000 LOOKAHEAD_SAMPLE_TOKENS=8 .venv/bin/python -m pytest tests/test_sampling.py
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from tests.conftest import make_llm

pytestmark = pytest.mark.engine

N_SAMPLES = int(os.environ.get("LOOKAHEAD_SAMPLES", "1200"))
# A request drafts from its third step on (its state is built after its first token went out), so 4 tokens: the
# third and fourth are drawn through trees.
MAX_TOKENS = int(os.environ.get("LOOKAHEAD_SAMPLE_TOKENS", "4"))
SETTINGS = {
    "t1.0": {"temperature": 1.0},
    "t0.7-p0.9": {"temperature": 0.7, "top_p": 0.9},
    "k20": {"temperature": 1.0, "top_k": 20},
}
# Each setting on one prompt, the prompts taking turns: every setting's path through the tree is sampled, at half
# the engine time of every pairing (the plain and lookahead engines together took about 5 minutes for six cases).
CASES = [(i % 2, key) for i, key in enumerate(SETTINGS)]
# Every node pays, so every sampled request carries a tree; the budget keeps a 256-wide batch's steps small.
LA_CONFIG = {"method": "lookahead", "node_cost": 0.0, "step_token_budget": 768}
BLOCK = 32  # KV block (the CPU backend's smallest): prompts of BLOCK + 1 tokens are prefix-cached but one token


def _prompts(model_path: str) -> list[list[int]]:
    # Repetitive, so that the pool, lookup and suffix candidates find continuations the model often samples (the
    # trees have work to do), and cut to BLOCK + 1 tokens so that thousands of samples cost one prefill.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    texts = [
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,",
        "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\nfor i in range(10):\n",
    ]
    return [tok(t)["input_ids"][: BLOCK + 1] for t in texts]


def _sample(llm, prompt: list[int], setting: dict) -> list[tuple[int, ...]]:
    from vllm import SamplingParams

    sp = SamplingParams(n=N_SAMPLES, max_tokens=MAX_TOKENS, ignore_eos=True, **setting)
    out = llm.generate({"prompt_token_ids": prompt}, sp, use_tqdm=False)[0]
    return [tuple(c.token_ids) for c in out.outputs]


def chi_square_p(a: list, b: list, min_expected: float = 5.0) -> float:
    """Two-sample chi-square test of homogeneity; categories rarer than min_expected pooled into one."""
    from scipy.stats import chi2_contingency

    ca, cb = Counter(a), Counter(b)
    total = len(a) + len(b)
    keep = [k for k in set(ca) | set(cb) if (ca[k] + cb[k]) * min(len(a), len(b)) / total >= min_expected]
    rows = [[ca[k] for k in keep], [cb[k] for k in keep]]
    rest = [len(a) - sum(rows[0]), len(b) - sum(rows[1])]
    if min(rest) > 0 or max(rest) > 0:
        rows[0].append(rest[0])
        rows[1].append(rest[1])
    if len(rows[0]) < 2:
        return 1.0
    return float(chi2_contingency(rows)[1])


def test_chi_square_helper_detects_a_different_distribution():
    import random

    rng = random.Random(0)
    a = [rng.choice("aabc") for _ in range(2000)]
    b = [rng.choice("abbc") for _ in range(2000)]
    same = [rng.choice("aabc") for _ in range(2000)]
    assert chi_square_p(a, b) < 1e-6
    assert chi_square_p(a, same) > 0.001


@pytest.fixture(scope="module")
def samples(model_path):
    out = {}
    for name, spec in (("plain", None), ("lookahead", LA_CONFIG)):
        llm = make_llm(
            model_path,
            alone=True,
            max_model_len=512,
            max_num_seqs=256,
            speculative_config=spec,
            disable_log_stats=False,
            enable_prefix_caching=True,
            block_size=BLOCK,
        )
        try:
            prompts = _prompts(model_path)
            got = {(i, key): _sample(llm, prompts[i], SETTINGS[key]) for i, key in CASES}
            counters = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
            stats = llm.collective_rpc("lookahead_stats")[0]
            out[name] = (got, counters, stats)
        finally:
            del llm
    return out


@pytest.mark.parametrize(("prompt", "key"), CASES)
def test_lookahead_samples_follow_the_plain_distribution(samples, prompt, key):
    plain, la = samples["plain"][0][(prompt, key)], samples["lookahead"][0][(prompt, key)]
    assert len(plain) == len(la) == N_SAMPLES
    # the first three tokens jointly, and each later position on its own
    p_joint = chi_square_p([s[:3] for s in la], [s[:3] for s in plain])
    assert p_joint > 0.001, (key, prompt, p_joint)
    for pos in range(1, MAX_TOKENS):
        p = chi_square_p([s[pos] for s in la], [s[pos] for s in plain])
        assert p > 0.001 / MAX_TOKENS, (key, prompt, pos, p)
    # conditioned on a fixed prefix (the most common first token): the next token's distribution
    first = Counter(s[0] for s in plain).most_common(1)[0][0]
    p_cond = chi_square_p([s[1] for s in la if s[0] == first], [s[1] for s in plain if s[0] == first])
    assert p_cond > 0.001, (key, prompt, first, p_cond)


def test_sampled_requests_were_verified_on_trees(samples):
    _, counters, stats = samples["lookahead"]
    generated = counters["vllm:generation_tokens"]
    accepted = counters["vllm:spec_decode_num_accepted_tokens"]
    # The target's draws followed tree nodes: a request's drafts can fill its tokens but the prefill's, its second
    # step's (it has no state before) and its last step's own (no draft past max_tokens), so at most MAX_TOKENS - 3 a
    # request are accepted.
    most = generated / MAX_TOKENS * (MAX_TOKENS - 3)
    assert accepted > 0.3 * most
    assert stats["sampled_accepted"] >= accepted
