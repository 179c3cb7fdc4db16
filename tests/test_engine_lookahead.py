"""Lookahead inside the real vLLM CPU engine on the default model (float32, where exactness is defined).

One engine without speculation and one with lookahead see the same mixed batch; greedy outputs, and seeded sampled
ones, must be identical token for token, with fewer target forward passes than tokens.
"""

from __future__ import annotations

import time

import pytest

from tests.conftest import make_llm
from vllm_lookahead.backends.cpu import library
from vllm_lookahead.core.acceptance import CALIBRATION_RANGE
from vllm_lookahead.devtools.prompts import as_chat, humaneval_prompts, sharegpt_prompts
from vllm_lookahead.glue.stats import SOURCE_NAMES

pytestmark = pytest.mark.engine

# Every node pays (node_cost 0) and the budget fits every request of the 8-wide batch: each request gets its whole
# tree, as the reference decoder builds it (suffix trees over each request's own text only, as there).
LA_CONFIG = {
    "method": "lookahead",
    "window_size": 4,
    "ngram_size": 3,
    "guess_set_size": 4,
    "step_token_budget": 512,
    "node_cost": 0.0,
    "suffix_cache_requests": 0,
}
MAX_MODEL_LEN = 1024
MAX_NUM_SEQS = 8


def _counters(llm) -> dict[str, float]:
    out = {}
    for m in llm.get_metrics():
        if m.name in (
            "vllm:spec_decode_num_drafts",
            "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens",
            "vllm:generation_tokens",
        ):
            out[m.name] = out.get(m.name, 0) + m.value
    return out


def _settled_stats(llm, timeout: float = 10.0) -> dict[str, float]:
    """The worker's counters once no request's state is left, or after `timeout` (then a leak fails the test).

    vLLM tells the worker which requests finished at its next engine step, which can run after `generate` returned
    and after this call was queued: right after `generate` the last request's state may still be there. An engine
    in this process (`make_llm`) steps only when called, so it is stepped once to pass the news on.
    """
    from vllm.v1.engine.core_client import InprocClient

    if isinstance(llm.llm_engine.engine_core, InprocClient):
        llm.llm_engine.step()
    deadline = time.monotonic() + timeout
    while True:
        stats = llm.collective_rpc("lookahead_stats")[0]
        if stats["live_states"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


@pytest.fixture(scope="module")
def batch(model_path):
    """>= 32 requests: HumanEval and ShareGPT prompts of different lengths, max_tokens, stops, EOS, one near
    max_model_len, some opted out of lookahead, seeded sampled ones (on trees, and one opted out)."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    tok = AutoTokenizer.from_pretrained(model_path)
    prompts: list = []
    params: list = []
    kinds: list[str] = []
    for i, p in enumerate(humaneval_prompts(18)):
        prompts.append(p)
        stop = ["\ndef ", "\n\n\n"] if i % 3 == 0 else None
        params.append(SamplingParams(temperature=0.0, max_tokens=(24, 48, 80)[i % 3], stop=stop))
        kinds.append("humaneval")
    for i, p in enumerate(sharegpt_prompts(14, max_chars=1200)):
        prompts.append(as_chat(tok, p))
        params.append(SamplingParams(temperature=0.0, max_tokens=(32, 64, 96)[i % 3]))
        kinds.append("sharegpt")
    # Near max_model_len: the tree must shrink to fit the last positions.
    long_ids = tok("\n".join(humaneval_prompts(40)))["input_ids"][: MAX_MODEL_LEN - 20]
    prompts.append({"prompt_token_ids": long_ids})
    params.append(SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    kinds.append("long")
    # Logprobs: served on trees, each accepted token's logprobs from the node that verified it.
    for p, sp in zip(
        humaneval_prompts(26)[24:],
        (
            SamplingParams(temperature=0.0, max_tokens=48, logprobs=3),
            SamplingParams(temperature=0.9, top_p=0.95, seed=5, max_tokens=32, logprobs=2, ignore_eos=True),
        ),
        strict=True,
    ):
        prompts.append(p)
        params.append(sp)
        kinds.append("logprobs")
    # Per-request opt-out, mixed into the same batch.
    for p in humaneval_prompts(21)[18:]:
        prompts.append(p)
        params.append(SamplingParams(temperature=0.0, max_tokens=40, extra_args={"lookahead": False}))
        kinds.append("opt-out")
    # Seeded sampling: on the tree, each token is the target's own draw with the request's generator, so the output
    # is plain decoding's, token for token. Next to the long prompt, near max_model_len, vLLM would pad every
    # request's drafts with zeros (the runner patch turns that off): the sampled requests share those steps.
    for p, sp in zip(
        humaneval_prompts(24)[21:],
        (
            SamplingParams(temperature=0.8, seed=7, max_tokens=32, ignore_eos=True),
            SamplingParams(temperature=0.7, top_p=0.9, top_k=20, seed=11, max_tokens=32, ignore_eos=True),
            SamplingParams(temperature=1.0, seed=3, max_tokens=24, ignore_eos=True, extra_args={"lookahead": False}),
        ),
        strict=True,
    ):
        prompts.insert(kinds.index("long") + 1, p)
        params.insert(kinds.index("long") + 1, sp)
        kinds.insert(kinds.index("long") + 1, "sampled opt-out" if sp.extra_args else "sampled")
    return prompts, params, kinds


@pytest.fixture(scope="module")
def plain_llm(model_path):
    llm = make_llm(model_path, max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS)
    yield llm
    del llm


@pytest.fixture(scope="module")
def plain_generation(plain_llm, batch):
    prompts, params, _ = batch
    return plain_llm.generate(prompts, params, use_tqdm=False)


@pytest.fixture(scope="module")
def plain_outputs(plain_generation):
    return [list(o.outputs[0].token_ids) for o in plain_generation]


@pytest.fixture(scope="module")
def la_llm(model_path):
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a test function
    llm = make_llm(
        model_path,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=MAX_NUM_SEQS,
        speculative_config=LA_CONFIG,
        disable_log_stats=False,
    )
    yield llm
    del llm
    mp.undo()


def test_greedy_batch_identical_to_plain_decoding(la_llm, batch, plain_outputs, plain_generation):
    prompts, params, kinds = batch
    assert len(prompts) >= 32
    before = _counters(la_llm)
    stats_before = la_llm.collective_rpc("lookahead_stats")[0]
    outs = la_llm.generate(prompts, params, use_tqdm=False)
    got = [list(o.outputs[0].token_ids) for o in outs]
    mismatched = [(i, kinds[i]) for i, (a, b) in enumerate(zip(got, plain_outputs, strict=True)) if a != b]
    if mismatched:
        from transformers import AutoTokenizer

        from vllm_lookahead.devtools.models import default_model_path

        tk = AutoTokenizer.from_pretrained(default_model_path())
        for i, _ in mismatched:
            a, b = got[i], plain_outputs[i]
            j = next((t for t in range(min(len(a), len(b))) if a[t] != b[t]), min(len(a), len(b)))
            print(
                "DIVERGE",
                i,
                kinds[i],
                j,
                len(a),
                len(b),
                repr(tk.decode(a[max(0, j - 5) : j + 5])),
                "|||",
                repr(tk.decode(b[max(0, j - 5) : j + 5])),
            )
    assert not mismatched, f"outputs differ from plain decoding for {mismatched}"
    # Logprobs requests: the same top tokens with the same values (float32 noise aside) at every position.
    for i in (i for i, k in enumerate(kinds) if k == "logprobs"):
        got_lp, want_lp = outs[i].outputs[0].logprobs, plain_generation[i].outputs[0].logprobs
        assert got_lp is not None and len(got_lp) == len(want_lp) == len(got[i])
        for pos, (a, b) in enumerate(zip(got_lp, want_lp, strict=True)):
            assert a.keys() == b.keys(), (i, pos)
            for tok in a:
                assert abs(a[tok].logprob - b[tok].logprob) < 1e-3, (i, pos, tok)
                assert a[tok].rank == b[tok].rank, (i, pos, tok)
    # The batch exercised what it claims: stop strings, EOS, length limits and the long prompt.
    reasons = {o.outputs[0].finish_reason for o in outs}
    assert {"stop", "length"} <= reasons
    assert len(got[kinds.index("long")]) == 20

    after = _counters(la_llm)
    stats = _settled_stats(la_llm)
    accepted = after["vllm:spec_decode_num_accepted_tokens"] - before.get("vllm:spec_decode_num_accepted_tokens", 0)
    generated = after["vllm:generation_tokens"] - before.get("vllm:generation_tokens", 0)
    # vLLM counts tokens generated before a stop string was cut off, so at least the outputs' tokens.
    assert generated >= sum(len(g) for g in got)
    assert accepted > 0.2 * generated  # lookahead did accept drafts, vLLM's counters saw them
    assert stats["accepted"] - stats_before["accepted"] >= accepted  # overshoot past a stop is cut by vLLM
    # opt-out requests took the plain path; no per-request state outlives its request.
    opted_out = kinds.count("opt-out") + kinds.count("sampled opt-out")
    assert stats["fallback_requests"] - stats_before["fallback_requests"] == opted_out
    assert stats["live_states"] == 0
    # the batch's decoding steps fed the step-cost fit, with the engine's work between steps counted
    assert stats["timed_steps"] > stats_before["timed_steps"]
    assert stats["timed_step_span"] > 0 and stats["timed_step_gap"] > 0
    # the tree rows went through the compiled kernel (its reference, the plain-torch path, is tested against it)
    if library.load() is not None:
        assert stats["kernel_attention_steps"] > stats_before["kernel_attention_steps"]
        assert stats["reference_attention_steps"] == stats_before["reference_attention_steps"]
    # the sampled requests were served on trees: more than one token per forward pass for them
    assert stats["sampled_accepted"] > stats_before["sampled_accepted"]
    # every candidate source was in the trees and had nodes accepted (verified exactly: the outputs above)
    for source in ("lookup", "pool", "suffix", "window", "recycle"):
        assert stats[f"drafted_{source}"] > stats_before[f"drafted_{source}"], source
    for source in ("lookup", "suffix", "recycle"):
        assert stats[f"accepted_{source}"] > stats_before[f"accepted_{source}"], source
    # the verified nodes' scores were summed: a probability each, so at most one a node
    drafted = sum(stats[f"drafted_{s}"] - stats_before[f"drafted_{s}"] for s in SOURCE_NAMES)
    assert 0 < stats["carried_score"] - stats_before["carried_score"] <= drafted
    # and weighed against what was accepted of them: the sizing's calibration moved off its prior of 1
    lo, hi = CALIBRATION_RANGE
    assert lo <= stats["calibration"] <= hi and stats["calibration"] != 1.0
    # every draft vLLM scheduled was one of the trees' nodes: none of vLLM's zero padding, which it adds to the whole
    # batch while one request (the long one) is within num_speculative_tokens of max_model_len
    vllm_drafts = after["vllm:spec_decode_num_draft_tokens"] - before.get("vllm:spec_decode_num_draft_tokens", 0)
    assert 0 < vllm_drafts <= drafted


def _price_branches(worker, price: float | None) -> None:
    """Run on the worker: a measured step cost in which a branched tree costs `price` seconds more (None: back to
    the module's fixed cost)."""
    from vllm_lookahead.core.cost import StepCost

    engine = worker.model_runner._lookahead
    if price is None:
        engine.drafting.cost = StepCost(engine.params.node_cost)
        return
    cost = StepCost()
    for i in range(1600):  # every request count up to 16, branched and not, 0-23 drafts
        r, d, b = 1 + i % 16, i % 24, (i // 16) % 2 == 0
        cost.observe(r, d, b, 0.030 + 0.001 * r + 0.0002 * d + price * b)
    engine.drafting.cost = cost


def test_chains_where_branches_do_not_pay_their_price(la_llm, batch, plain_outputs):
    """Where a branched tree costs more than its branches bring, each request verifies its best chain alone: vLLM's
    own attention for every row (the tree kernel never runs), drafts still accepted, outputs still exact."""
    prompts, params, kinds = batch
    greedy = [i for i, k in enumerate(kinds) if k in ("humaneval", "sharegpt")][::3]

    def run(price: float) -> tuple[dict, dict]:
        before = la_llm.collective_rpc("lookahead_stats")[0]
        la_llm.collective_rpc(_price_branches, args=(price,))
        try:
            outs = la_llm.generate([prompts[i] for i in greedy], [params[i] for i in greedy], use_tqdm=False)
        finally:
            la_llm.collective_rpc(_price_branches, args=(None,))
        assert [list(o.outputs[0].token_ids) for o in outs] == [plain_outputs[i] for i in greedy]
        return before, la_llm.collective_rpc("lookahead_stats")[0]

    before, after = run(5.0)
    assert after["accepted"] > before["accepted"]
    assert after["step_cost_branched_t8"] == after["step_cost_t8"]  # the module's fixed cost is back
    assert after["kernel_attention_steps"] == before["kernel_attention_steps"]
    assert after["reference_attention_steps"] == before["reference_attention_steps"]
    # the same requests with free branches do branch: the chains above were the price's doing
    if library.load() is not None:
        before, after = run(0.0)
        assert after["kernel_attention_steps"] > before["kernel_attention_steps"]


def test_one_forward_pass_per_step(la_llm, batch):
    """A single request: target forward passes == output tokens - accepted tokens (prefill included)."""
    from vllm import SamplingParams

    prompts, _, _ = batch
    before = _counters(la_llm)
    steps_before = la_llm.collective_rpc("lookahead_stats")[0]["steps"]
    out = la_llm.generate(prompts[1], SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True), use_tqdm=False)
    steps = la_llm.collective_rpc("lookahead_stats")[0]["steps"] - steps_before
    after = _counters(la_llm)
    tokens = len(out[0].outputs[0].token_ids)
    accepted = after["vllm:spec_decode_num_accepted_tokens"] - before["vllm:spec_decode_num_accepted_tokens"]
    assert tokens == 64
    # Every pass yields 1 + its accepted drafts; only the last one may run past max_tokens (vLLM cuts the output
    # but has counted those acceptances), by less than the tree's deepest path.
    from vllm_lookahead.core.params import LookaheadParams

    p = LookaheadParams()
    overshoot = steps + accepted - tokens
    assert 0 <= overshoot < max(p.suffix_depth, p.lookup_len, p.ngram_size), (steps, accepted, tokens)
    assert steps < tokens  # fewer passes than tokens: lookahead worked


# The engine's token-recycling table holds every earlier request's rows, the oracle's only its own sequence's: the
# requests compared with the oracle turn the source off for themselves.
NO_RECYCLING = {"recycle_candidates": 0}


def test_steps_match_the_reference_decoder(la_llm, model_path):
    """Same prompts, same (W, N, G, seed): the transformers oracle takes the same number of steps."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import SamplingParams

    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.devtools.reference_decoder import lookahead_generate

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    for prompt in humaneval_prompts(3):
        ids = tok(prompt)["input_ids"]
        params = LookaheadParams.from_mapping({k: v for k, v in LA_CONFIG.items() if k != "method"})
        ref, ref_stats = lookahead_generate(
            model, ids, 48, params.for_request(NO_RECYCLING), eos_token_id=[], as_engine=True
        )
        steps_before = la_llm.collective_rpc("lookahead_stats")[0]["steps"]
        sp = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, extra_args={"lookahead": NO_RECYCLING})
        out = la_llm.generate({"prompt_token_ids": ids}, sp, use_tqdm=False)
        steps = la_llm.collective_rpc("lookahead_stats")[0]["steps"] - steps_before
        assert list(out[0].outputs[0].token_ids) == ref
        # Both count the prefill as one pass and run the same window, pool and tree, the oracle under the engine's
        # drafting rules (`as_engine`: no tree before the first token went out, none past max_tokens): same steps,
        # unless an argmax tie at a window node breaks differently between the two kernels (then within one or two).
        assert abs(steps - ref_stats["steps"]) <= 2, (steps, ref_stats["steps"])


def test_preemption_drops_and_rebuilds_state(model_path, batch, plain_outputs):
    """A KV cache too small for the batch forces preemptions; outputs stay exact, no state leaks."""
    prompts, params, kinds = batch
    idx = [i for i, k in enumerate(kinds) if k == "humaneval"][:8]
    llm = make_llm(
        model_path,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=8,
        num_gpu_blocks_override=9,  # 9 x 128 tokens (one max_model_len) for 8 requests of ~200-300 tokens
        speculative_config=LA_CONFIG,
    )
    try:
        outs = llm.generate([prompts[i] for i in idx], [params[i] for i in idx], use_tqdm=False)
        stats = _settled_stats(llm)
    finally:
        del llm
    assert [list(o.outputs[0].token_ids) for o in outs] == [plain_outputs[i] for i in idx]
    assert stats["preemptions"] > 0
    assert stats["live_states"] == 0


# A request's own settings: a 1-column window of bigrams, one pool candidate, no lookup, suffix or recycled
# candidates.
OWN_SETTINGS = {
    "window_size": 1,
    "ngram_size": 2,
    "guess_set_size": 1,
    "lookup_candidates": 0,
    "suffix_candidates": 0,
    **NO_RECYCLING,
}


def test_per_request_settings_are_the_reference_decoders_steps(la_llm, model_path):
    """A request with its own (W, N, G, sources) runs them: the oracle with those settings takes the same steps,
    the sources it turned off draft nothing, and other requests keep the server's settings."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import SamplingParams

    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.devtools.reference_decoder import lookahead_generate

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    server = LookaheadParams.from_mapping({k: v for k, v in LA_CONFIG.items() if k != "method"})
    own = server.for_request(OWN_SETTINGS)
    for prompt in humaneval_prompts(2):
        ids = tok(prompt)["input_ids"]
        ref, ref_stats = lookahead_generate(model, ids, 48, own, eos_token_id=[])
        _, server_stats = lookahead_generate(model, ids, 48, server, eos_token_id=[])
        before = _settled_stats(la_llm)
        out = la_llm.generate(
            {"prompt_token_ids": ids},
            SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, extra_args={"lookahead": OWN_SETTINGS}),
            use_tqdm=False,
        )
        after = _settled_stats(la_llm)
        assert list(out[0].outputs[0].token_ids) == ref
        assert abs(after["steps"] - before["steps"] - ref_stats["steps"]) <= 2, (after["steps"], ref_stats["steps"])
        # The settings made a difference the oracle sees too, and the sources turned off drafted nothing.
        assert ref_stats["steps"] != server_stats["steps"]
        for source in ("lookup", "suffix", "recycle"):
            assert after[f"drafted_{source}"] == before[f"drafted_{source}"], source
        # Its trees were its own size: at most own.max_tree_nodes nodes a step.
        drafted = sum(after[k] - before[k] for k in after if k.startswith("drafted_"))
        tree_steps = after["tree_steps"] - before["tree_steps"]
        assert 0 < drafted <= tree_steps * (own.max_tree_nodes - 1) < tree_steps * (server.max_tree_nodes - 1)


def test_invalid_per_request_settings_refuse_that_request_only(la_llm):
    """Refused as vLLM refuses a bad sampling parameter (VLLMValidationError, HTTP 400), naming the key."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    bad = SamplingParams(max_tokens=8, extra_args={"lookahead": {"window_size": LA_CONFIG["window_size"] + 1}})
    with pytest.raises(VLLMValidationError, match=r"extra_args\.lookahead\.window_size must be an integer in \[1, 4\]"):
        la_llm.generate("def add(a, b):", bad, use_tqdm=False)
    with pytest.raises(VLLMValidationError, match=r"extra_args\.lookahead\.node_cost is engine-wide"):
        la_llm.generate("def add(a, b):", SamplingParams(extra_args={"lookahead": {"node_cost": 1.0}}), use_tqdm=False)
    out = la_llm.generate("def add(a, b):", SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 8
    assert _settled_stats(la_llm)["live_states"] == 0


def _served(llm, prompt, sp) -> list[tuple[int, ...]] | str:
    """Each output's tokens, or the error the request was refused with."""
    try:
        out = llm.generate(prompt, sp, use_tqdm=False)
    except Exception as e:  # noqa: BLE001 - the refusal itself is what is compared
        return f"{type(e).__name__}: {e}"
    return [tuple(c.token_ids) for c in out[0].outputs]


def test_odd_requests_are_served_or_refused_as_plain_decoding(plain_llm, la_llm, model_path):
    """Empty prompts, prompts that fill the context, one-token outputs, n > 1, stops inside an accepted run and
    out-of-vocabulary ids: what lookahead returns (or the error it raises) is plain decoding's."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    tok = AutoTokenizer.from_pretrained(model_path)
    code = humaneval_prompts(5)[4]
    greedy = SamplingParams(temperature=0.0, max_tokens=48)
    # A stop string from the middle of plain decoding's own output, so that the cut falls inside the output.
    plain_out = plain_llm.generate(code, greedy, use_tqdm=False)[0].outputs[0]
    plain_text = plain_out.text
    stop = plain_text[len(plain_text) // 2 :][:6]
    full = tok("\n".join(humaneval_prompts(40)))["input_ids"][: MAX_MODEL_LEN - 1]
    cases = {
        "empty prompt ids": ({"prompt_token_ids": []}, greedy),
        "empty prompt text": ("", greedy),
        "prompt of max_model_len - 1": ({"prompt_token_ids": full}, SamplingParams(temperature=0.0, max_tokens=8)),
        "prompt of max_model_len": ({"prompt_token_ids": [*full, 13]}, greedy),
        "max_tokens=1": (code, SamplingParams(temperature=0.0, max_tokens=1)),
        "n=3 seeded": (code, SamplingParams(n=3, temperature=0.8, seed=3, max_tokens=24, ignore_eos=True)),
        "n=2 seeded top-k": (code, SamplingParams(n=2, temperature=0.6, top_k=8, seed=5, max_tokens=24)),
        "stop inside the output": (code, SamplingParams(temperature=0.0, max_tokens=48, stop=[stop])),
        "out-of-vocabulary id": ({"prompt_token_ids": [1, 2, tok.vocab_size + 1000]}, greedy),
        "negative id": ({"prompt_token_ids": [1, -5, 2]}, greedy),
    }
    got = {name: _served(la_llm, prompt, sp) for name, (prompt, sp) in cases.items()}
    want = {name: _served(plain_llm, prompt, sp) for name, (prompt, sp) in cases.items()}
    for name in cases:
        assert got[name] == want[name], name
    # The cases test what they say: refusals where plain decoding refuses, outputs where it serves.
    assert isinstance(want["out-of-vocabulary id"], str) and isinstance(want["prompt of max_model_len"], str)
    assert len(want["prompt of max_model_len - 1"][0]) == 1 and len(want["max_tokens=1"][0]) == 1
    assert len(want["n=3 seeded"]) == 3 and len(set(want["n=3 seeded"])) > 1
    assert len(want["stop inside the output"][0]) < len(plain_out.token_ids)
    assert _settled_stats(la_llm)["live_states"] == 0


def test_greedy_neighbours_that_change_their_logits_keep_their_own_tokens(plain_llm, la_llm):
    """A greedy batch where some requests change their logits before sampling (bad words, a repetition penalty):
    lookahead takes each x0 row's argmax in place of vLLM's sampler only in steps where no request does, so every
    output, the lookahead requests' and their neighbours', is plain decoding's."""
    from vllm import SamplingParams

    code = humaneval_prompts(5)
    greedy = SamplingParams(temperature=0.0, max_tokens=32)
    unbiased = plain_llm.generate(code[0], greedy, use_tqdm=False)[0].outputs[0]
    word = max(unbiased.text.split(), key=len)  # vLLM refuses a logit bias with speculative decoding
    neighbours = [
        SamplingParams(temperature=0.0, max_tokens=32, bad_words=[word]),
        SamplingParams(temperature=0.0, max_tokens=32, repetition_penalty=1.5),
    ]
    prompts = [*code[1:], code[0], code[0]]
    params = [greedy] * 4 + neighbours
    got = [list(o.outputs[0].token_ids) for o in la_llm.generate(prompts, params, use_tqdm=False)]
    want = [list(o.outputs[0].token_ids) for o in plain_llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    # The neighbours test what they say: their logits change what greedy decoding outputs.
    assert want[4] != list(unbiased.token_ids) and want[5] != list(unbiased.token_ids)


def test_a_suffix_corpus_is_drafted_from_the_first_request_on(tmp_path, model_path, plain_llm):
    """suffix_corpus: the texts are in the shared suffix tree at start-up; a request whose answer one of them holds
    drafts it from its first steps, and its output stays plain decoding's."""
    import json

    from vllm import SamplingParams

    prompt = humaneval_prompts(30)[-1]  # none of the batch's
    greedy = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    (plain,) = plain_llm.generate([prompt], greedy, use_tqdm=False)
    assert len(plain.outputs[0].token_ids) == 64
    corpus = tmp_path / "corpus.jsonl"
    texts = [{"text": plain.outputs[0].text}, "An unrelated text about something else.", {"text": "def f(x):"}]
    corpus.write_text("\n".join(json.dumps(t) for t in texts) + "\n", encoding="utf-8")
    config = {**LA_CONFIG, "suffix_cache_requests": 16, "suffix_corpus": str(corpus)}
    llm = make_llm(model_path, max_model_len=MAX_MODEL_LEN, max_num_seqs=2, speculative_config=config)
    try:
        start = _settled_stats(llm)
        (out,) = llm.generate([prompt], greedy, use_tqdm=False)
        stats = _settled_stats(llm)
    finally:
        del llm
    assert start["suffix_cached_requests"] == 3 and start["suffix_cached_tokens"] > 64
    assert list(out.outputs[0].token_ids) == list(plain.outputs[0].token_ids)
    accepted = sum(stats[k] - start[k] for k in ("accepted_suffix", "accepted_suffix_short"))
    assert accepted >= len(out.outputs[0].token_ids) // 2  # the corpus's copy carried most of the answer
