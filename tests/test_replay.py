"""The replay instrument (`benchmarks/research/replay_trees.py`): lookahead's drafting replayed on known greedy
outputs."""

from __future__ import annotations

import pytest

from tests.scripts import load_script
from vllm_lookahead.core.params import LookaheadParams

replay_trees = load_script("benchmarks/research/replay_trees.py")
cost_model, parse_args, replay, main = (
    replay_trees.cost_model,
    replay_trees.parse_args,
    replay_trees.replay,
    replay_trees.main,
)
calibration_table, replay_suffix = replay_trees.calibration_table, replay_trees.replay_suffix
replay_batch = replay_trees.replay_batch
with_plugin_seconds, vllm_suffix_defaults = replay_trees.with_plugin_seconds, replay_trees.vllm_suffix_defaults

PERIOD = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]


def test_replay_reproduces_the_outputs_and_drafts_what_repeats():
    params = LookaheadParams(suffix_candidates=0)
    repeating = [(PERIOD[:6], (PERIOD * 10)[6:100])]
    per_step, nodes, rate = replay(repeating, params, cost_model(0.035, 0.001))
    assert per_step > 2.0 and nodes > 1.0 and rate > 1 / 0.035
    # a text with nothing to copy: no draft pays, one token per step, the plain rate
    fresh = [([1, 2], list(range(10, 90)))]
    assert replay(fresh, params, cost_model(0.035, 0.001))[0] == pytest.approx(1.0, abs=0.05)


def test_a_replay_that_does_not_match_its_output_is_refused(monkeypatch):
    import vllm_lookahead.core.verify as verify

    real = verify.greedy_verify

    def wrong(tree, argmax):  # noqa: ANN001, ANN202
        nodes, tokens = real(tree, argmax)
        return nodes, [*tokens[:-1], tokens[-1] + 1]

    monkeypatch.setattr(verify, "greedy_verify", wrong)
    with pytest.raises(AssertionError, match="differs"):
        replay([(PERIOD[:6], (PERIOD * 3)[6:30])], LookaheadParams(suffix_candidates=0), cost_model(0.035, 0.001))


def test_replay_feeds_token_recycling_the_top_tokens_it_is_given():
    # every source but token recycling off (a 1-column window of bigrams holds only x0)
    params = LookaheadParams(
        window_size=1,
        ngram_size=2,
        guess_set_size=0,
        pool_from_output=False,
        pool_from_prompt=False,
        lookup_candidates=0,
        suffix_candidates=0,
        recycle_candidates=8,
    )
    output = (PERIOD * 8)[6:100]
    prompt = PERIOD[:6]
    seq = prompt + output
    # the target's top tokens at the row that produced output[j]: the right one first, then two others
    tops = [[output[j], 50 + j % 7, 60] for j in range(len(output))]
    assert seq[len(prompt) :] == output
    with_tops = replay([(prompt, output, tops)], params, cost_model(0.035, 0.0001))[0]
    without = replay([(prompt, output)], params, cost_model(0.035, 0.0001))[0]
    assert without == pytest.approx(1.0)
    assert with_tops > 1.3  # (PERIOD repeats tokens with other successors: the table holds the last)


def test_trees_sized_by_one_cost_and_paid_at_another():
    """`truth`: the steps cost what the true model says, whatever model sized the trees. Sized by a dearer line than
    the knee's cost, fewer nodes are drafted; sized by the true cost itself, no other sizing does better."""
    params = LookaheadParams(suffix_candidates=0)
    text = [(PERIOD[:6], (PERIOD * 10)[6:100])]
    knee = cost_model(0.035, 0.002, knee=6, below=0.0)
    own = replay(text, params, knee, truth=knee)
    assert replay(text, params, knee) == own  # truth defaults to the sizing's own cost
    dear = replay(text, params, cost_model(0.035, 0.01), truth=knee)
    assert dear[1] < own[1] and dear[2] <= own[2]


@pytest.mark.parametrize(
    "flags",
    [
        ["--sizing-line", "0.03"],
        ["--sizing-line", "0.03,x"],
        ["--sizing-line", "0,0.001"],
        ["--sizing-line", "0.03,-0.001"],
        ["--fixed", "0"],
        ["--per-token", "-0.001"],
        ["--knee", "0"],
        ["--per-token", "0.001", "--per-token-below", "0.002"],
        ["--num-prompts", "0"],
        ["--suffix-seed", "-1"],
        ["--plugin-seconds", "-0.001"],
    ],
)
def test_bad_cost_flags_are_refused_naming_the_flag(flags, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(flags)
    assert stop.value.code == 2
    assert flags[-2] in capsys.readouterr().err


def test_a_seeded_suffix_tree_drafts_a_text_it_was_seeded_with():
    """--suffix-seed: a text the global suffix tree holds before any request is drafted from its first step on."""
    pytest.importorskip("arctic_inference")
    params = LookaheadParams(recycle_candidates=0)
    text = [(i * 7919) % 1000 + 10 for i in range(80)]  # no repeats inside: only the seed can predict it
    request = [([1, 2], text)]
    cheap = cost_model(0.035, 0.0001)
    alone, _, _ = replay(request, params, cheap)
    seeded, _, _ = replay(request, params, cheap, seed=[[3, *text]])
    assert alone < 1.2 and seeded > 3.0


def test_sizing_line_is_read_as_two_seconds():
    assert parse_args(["--sizing-line", "0.03,0.0012"]).sizing_line == (0.03, 0.0012)


def test_calibration_records_every_carried_node_the_output_went_through():
    params = LookaheadParams(suffix_candidates=0)
    prompt, output = PERIOD[:6], (PERIOD * 10)[6:100]
    records: list[tuple[float, bool, bool]] = []
    per_step, _, _ = replay([(prompt, output)], params, cost_model(0.035, 0.001), calibration=records)
    tokens = len(output) - 1  # the first is the prefill's
    steps = round(tokens / per_step)
    carried_accepted = sum(1 for _, carried, accepted in records if carried and accepted)
    # every accepted draft is a carried node the output went through; a step whose output ended inside its tree
    # may have one more such node than it emitted drafts
    assert tokens - steps <= carried_accepted <= tokens - steps + 1
    assert all(0.0 < score <= 1.0 for score, _, _ in records)
    assert any(not carried for _, carried, _ in records)  # the sizing left some drafted nodes out


def test_calibration_table_buckets_by_score():

    rows = calibration_table([(0.95, True, True), (0.93, True, False), (0.01, False, False)])
    assert rows[2] == "| 0.00-0.02 | 0 | - | - | 1 | 0.010 | 0.000 |"
    assert rows[3] == "| 0.90+ | 2 | 0.940 | 0.500 | 0 | - | - |"
    assert len(rows) == 4  # empty buckets are left out


def test_the_suffix_peer_drafts_chains_of_at_most_its_tokens_and_reproduces_the_output():
    """vLLM's suffix method replayed: one chain a step of at most num_speculative_tokens, verified against the output;
    a repeating text is drafted from, a text with nothing to copy is decoded a token a step."""
    pytest.importorskip("arctic_inference")

    cost = cost_model(0.035, 0.001)
    per_step, drafts, rate = replay_suffix([(PERIOD[:6], (PERIOD * 10)[6:100])], cost, num_speculative_tokens=4)
    assert 2.0 < per_step <= 5.0 and 0 < drafts <= 4.0
    assert rate == pytest.approx(per_step / cost_model_seconds(cost, drafts))
    fresh = replay_suffix([([1, 2], list(range(10, 90)))], cost)
    assert fresh[0] == pytest.approx(1.0) and fresh[1] == 0.0


def cost_model_seconds(model, drafts: float) -> float:
    """A straight-line cost model's seconds for a one-request step of `drafts` draft tokens (fractional: a mean)."""
    fixed = model.seconds(1, 0) - (model.seconds(1, 1) - model.seconds(1, 0))
    per_token = model.seconds(1, 1) - model.seconds(1, 0)
    return fixed + per_token * (1 + drafts)


def test_the_oracle_carries_only_the_drafts_the_output_goes_through():
    """--oracle: no draft a step carries is rejected, so each step's drafts are its tokens but the target's own (one
    fewer at the end of an output), and it makes at least the sized trees' tokens per step and per second."""
    params = LookaheadParams(suffix_candidates=0)
    text = [(PERIOD[:6], (PERIOD * 10)[6:100])]
    cost = cost_model(0.035, 0.002)
    per_step, drafts, rate = replay(text, params, cost, oracle=True)
    assert drafts == pytest.approx(per_step - 1)
    sized = replay(text, params, cost)
    assert per_step >= sized[0] and rate > sized[2] and drafts < sized[1]


def test_the_oracle_leaves_the_window_slots_it_did_not_carry_alone(monkeypatch):
    """The window learns only from the slots a step carried (cut-off slots keep their guesses): under --oracle, the
    ones on the output's path, up to its last draft (the step's last token is the target's own)."""
    from vllm_lookahead.core.state import LookaheadState

    seen: list[tuple[dict, set[int]]] = []
    real = LookaheadState.update

    def update(self, tree, argmax, accepted, top=None):  # noqa: ANN001, ANN202
        seen.append((dict(tree.window_node), tree.follow(accepted[:-1])[0]))  # the nodes of the step's drafts
        return real(self, tree, argmax, accepted, top)

    monkeypatch.setattr(LookaheadState, "update", update)
    replay(
        [(PERIOD[:6], (PERIOD * 10)[6:100])],
        LookaheadParams(suffix_candidates=0),
        cost_model(0.035, 0.002),
        oracle=True,
    )
    assert seen and all(set(slots.values()) <= path for slots, path in seen)
    assert any(set(slots.values()) - {0} for slots, _ in seen)  # the carried slots stay: the window still learns
    seen.clear()
    replay([(PERIOD[:6], (PERIOD * 10)[6:100])], LookaheadParams(suffix_candidates=0), cost_model(0.035, 0.0))
    assert any(not set(slots.values()) <= path for slots, path in seen)  # sized trees carry slots off the path


def test_oracle_and_calibration_together_are_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(["--oracle", "--calibration"])
    assert stop.value.code == 2 and "--oracle" in capsys.readouterr().err


def test_main_prints_lookahead_against_suffix_per_dataset(tmp_path, capsys):
    """The script end to end on a small sequences file, with and without --calibration (without it, main used to
    fail after its table)."""
    pytest.importorskip("arctic_inference")
    import json

    seqs = tmp_path / "s.json"
    req = [PERIOD[:6], (PERIOD * 6)[6:60]]
    seqs.write_text(json.dumps({"humaneval": [req, req], "sharegpt": [req, [[1, 2], list(range(10, 50))]]}))
    assert main(["--sequences", str(seqs)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| humaneval", "| sharegpt"))]
    assert len(rows) == 2 and all(line.endswith("x |") for line in rows)
    assert main(["--sequences", str(seqs), "--calibration", "--plugin-seconds", "0.002"]) == 0
    assert "node scores against acceptance" in capsys.readouterr().out


def test_plugin_seconds_are_added_to_every_step():

    # 2 tokens a step at 20 tokens/s is 0.1 s a step; 0.1 s more halves the rate
    assert with_plugin_seconds(2.0, 20.0, 0.1) == pytest.approx(10.0)
    assert with_plugin_seconds(2.0, 20.0, 0.0) == 20.0


def _vllm_suffix_chains(requests: list, num_spec: int) -> list[list[int]]:
    """Greedy batch-1 decoding of known outputs with vLLM's own `SuffixDecodingProposer` drafting (one request at a
    time, in order, the global tree shared, vLLM's default settings): every step's drafted chain."""
    from types import SimpleNamespace

    import numpy as np
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    spec = SimpleNamespace(
        num_speculative_tokens=num_spec, **{f"suffix_decoding_{k}": v for k, v in vllm_suffix_defaults().items()}
    )
    proposer = SuffixDecodingProposer(
        SimpleNamespace(speculative_config=spec, model_config=SimpleNamespace(max_model_len=4096))
    )
    chains = []
    for rid, (prompt, output) in enumerate(requests):
        req = f"r{rid}"
        seq, sampled = [*prompt, output[0]], [output[0]]  # the prefill's token
        while len(seq) - len(prompt) < len(output):
            row = np.zeros((1, 4096), dtype=np.int32)
            row[0, : len(seq)] = seq
            batch = SimpleNamespace(
                req_ids=[req],
                num_tokens_no_spec=[len(seq)],
                req_id_to_index={req: 0},
                num_prompt_tokens=[len(prompt)],
                token_ids_cpu=row,
            )
            (chain,) = proposer.propose(num_spec, batch, [sampled])
            chains.append(list(chain))
            sampled = []  # the accepted drafts, then the target's own token (the output's next)
            for draft, want in zip(chain, output[len(seq) - len(prompt) :], strict=False):
                sampled.append(want)
                if draft != want:
                    break
            else:
                sampled = output[len(seq) - len(prompt) : len(seq) - len(prompt) + len(chain) + 1]
            seq += sampled
    proposer.propose(num_spec, SimpleNamespace(req_ids=[], req_id_to_index={}), [])  # the last request leaves
    return chains


def test_the_suffix_peer_replays_what_vllms_own_proposer_drafts():
    """replay_suffix against vLLM's SuffixDecodingProposer itself, driven step by step over the same outputs: the
    same chain at every step (a wrong context, e.g. without the prefill's token, or other settings differ), and
    every output token counted once."""
    pytest.importorskip("arctic_inference")

    text = (PERIOD * 3 + [7, 7, 2, 3] + PERIOD[2:9] * 4)[:90]
    requests = [(PERIOD[:6], text[6:70]), ([5, 3, 5], text[20:80]), ([1, 4], [9, 9, *text[3:40]])]
    ours: list[list[int]] = []
    per_step, drafts, _ = replay_suffix(requests, cost_model(0.035, 0.001), num_speculative_tokens=6, chains=ours)
    assert ours == _vllm_suffix_chains(requests, num_spec=6)
    assert per_step * len(ours) == pytest.approx(sum(len(out) - 1 for _, out in requests))
    assert drafts * len(ours) == pytest.approx(sum(map(len, ours)))
    assert per_step > 1.5  # something was drafted and accepted


def test_requests_in_flight_cost_one_step_together():
    """--concurrency: the requests in flight decode in the same steps, each step priced once for all of them. Two
    texts with nothing to copy, two in flight: a first step computes both prompts (each request's first token), then
    every step decodes both, a token each."""
    params = LookaheadParams(suffix_candidates=0, recycle_candidates=0)
    fixed, per = 0.035, 0.001
    texts = [([1, 2], list(range(10, 50))), ([3, 4], list(range(60, 100)))]
    per_step, drafts, rate = replay_batch(texts, params, cost_model(fixed, per), concurrency=2)
    assert per_step == pytest.approx(1.0) and drafts == 0.0
    # the prompts' step (4 prompt tokens priced as drafts), then 39 steps of 2 requests
    assert rate == pytest.approx(80 / (fixed + per * (1 + 4) + 39 * (fixed + 2 * per)))


@pytest.mark.parametrize("method", ["lookahead", "suffix"])
def test_requests_in_flight_reproduce_their_outputs_and_draft_what_repeats(method):
    """Three repeating texts, two in flight (the third admitted when the first ends): each output replays exactly
    (the replay raises otherwise) and both methods draft from the repetition."""
    if method == "suffix":
        pytest.importorskip("arctic_inference")
    text = [(PERIOD[:6], (PERIOD * 10)[6 + k : 90 + k]) for k in range(3)]
    per_step, drafts, _ = replay_batch(
        text, LookaheadParams(suffix_candidates=0), cost_model(0.035, 0.001), concurrency=2, method=method
    )
    assert per_step > 1.5 and drafts > 0.5


@pytest.mark.parametrize("share", [4, 0])
def test_a_step_that_admits_a_prompt_carries_no_lookahead_drafts(share, monkeypatch):
    """The scheduler patch's rule, replayed: while the admitted requests are at least 1 / ADMISSION_SHARE of the
    running ones, no running request's tree is verified in the step that admits them (ADMISSION_SHARE 0: never)."""
    import vllm_lookahead.glue.patches.scheduler as scheduler
    from vllm_lookahead.core.state import LookaheadState
    from vllm_lookahead.glue.drafting import Drafting

    monkeypatch.setattr(scheduler, "ADMISSION_SHARE", share)
    events: list[tuple[str, object]] = []
    update, init, plan = LookaheadState.update, LookaheadState.__init__, Drafting.plan
    monkeypatch.setattr(
        LookaheadState, "update", lambda self, *a, **k: (events.append(("update", self.req_id)), update(self, *a, **k))
    )

    def new(self, *a, **k):  # noqa: ANN001, ANN202
        init(self, *a, **k)
        events.append(("new", self.req_id))

    monkeypatch.setattr(LookaheadState, "__init__", new)
    monkeypatch.setattr(Drafting, "plan", lambda self, *a, **k: (events.append(("plan", None)), plan(self, *a, **k))[1])
    short, long = (PERIOD * 10)[6:30], (PERIOD * 10)[6:96]
    # request 0 ends first and request 2 is admitted while request 1 runs on with its trees
    replay_batch(
        [(PERIOD[:6], short), (PERIOD[:6], long), (PERIOD[:6], short)],
        LookaheadParams(suffix_candidates=0),
        cost_model(0.035, 0.0001),
        concurrency=2,
    )
    admitted = events.index(("new", 2))
    opened = max(i for i in range(admitted) if events[i][0] == "plan")  # the drafting that ended the step before
    in_step = [who for kind, who in events[opened + 1 : admitted] if kind == "update"]
    assert in_step == ([] if share else [1])


def test_main_replays_requests_in_flight(tmp_path, capsys):
    pytest.importorskip("arctic_inference")
    import json

    seqs = tmp_path / "s.json"
    req = [PERIOD[:6], (PERIOD * 6)[6:60]]
    seqs.write_text(json.dumps({"humaneval": [req, req, req], "sharegpt": [req, req, [[1, 2], list(range(10, 50))]]}))
    assert main(["--sequences", str(seqs), "--concurrency", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 requests in flight" in out
    assert len([line for line in out.splitlines() if line.startswith(("| humaneval", "| sharegpt"))]) == 2


@pytest.mark.parametrize("flag", ["--oracle", "--calibration"])
def test_the_oracle_and_calibration_replay_one_request_at_a_time(flag, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(["--concurrency", "2", flag])
    assert stop.value.code == 2 and "--concurrency" in capsys.readouterr().err
