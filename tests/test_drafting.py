"""Drafting: the rest for requests whose trees carry nothing, and no drafts while prompts are prefilled in chunks (no
engine)."""

from __future__ import annotations

from vllm_lookahead.glue.resting import IDLE_AFTER, MAX_REST, Rests


def _builds(pattern: str, longest: int = MAX_REST) -> str:
    """Replay a run: at each step the request builds a tree unless resting; 'n' a tree that carried nothing, 'd' one
    that carried drafts. Returns which steps built ('b') or rested ('.')."""
    rests = Rests(longest)
    out, it = [], iter(pattern)
    for _ in range(len(pattern) * (longest + 1)):
        if rests.resting("r"):
            out.append(".")
            continue
        kind = next(it, None)
        if kind is None:
            break
        out.append("b")
        rests.built("r", carried=kind == "d")
    return "".join(out)


def test_empty_trees_rest_longer_up_to_a_cap_and_drafts_end_the_rest():
    assert (IDLE_AFTER, MAX_REST) == (2, 8)
    assert _builds("nnnnnn") == "bb.b..b....b........b........"  # rests of 1, 2, 4, then 8 steps at most
    assert _builds("nnnnnn", longest=3) == "bb.b..b...b...b..."  # a shorter cap (VLLM_LOOKAHEAD_REST=3)
    assert _builds("nnnnnn", longest=0) == "bbbbbb"  # no rest (tensor parallelism, VLLM_LOOKAHEAD_REST=0)
    assert _builds("dddd") == "bbbb"  # requests that draft never rest
    assert _builds("nnnndnnn") == "bb.b..b....bbb.b.."  # a tree that carried drafts starts the count again


class _Batch:
    def __init__(self, req_ids: list[str]) -> None:
        self.req_ids = req_ids
        self.num_reqs = len(req_ids)
        self.num_tokens_no_spec = [10] * len(req_ids)
        self.num_prompt_tokens = [4] * len(req_ids)


class _Runner:
    def __init__(self, req_ids: list[str], max_tokens: int | None = None) -> None:
        from vllm import SamplingParams

        self.input_batch = _Batch(req_ids)
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)

        class _Req:
            sampling_params = sp

        self.requests = {r: _Req() for r in req_ids}


class _Requests:
    """Every request eligible; a state that records the trees built (one node: nothing to draft) and the requests
    whose state was caught up."""

    def __init__(self, rests: Rests | None = None) -> None:
        self.rests = rests or Rests()
        self.built: list[int] = []
        self.touched: list[str] = []
        self.states: dict[str, object] = {}

    def eligible(self, runner: object, req_id: str) -> bool:
        return True

    def state(self, runner: object, index: int, req_id: str) -> object:
        from vllm_lookahead.core.acceptance import AcceptanceStats
        from vllm_lookahead.core.tree import StepTree

        built = self.built
        self.touched.append(req_id)
        self.states[req_id] = None

        class _State:
            stats = AcceptanceStats()

            def build_tree(self, x0: int, min_score: float = 0.0) -> StepTree:
                built.append(x0)
                return StepTree.chain([x0])

        return _State()


def _drafting():
    from vllm_lookahead.backends import ChainBackend
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.glue.drafting import Drafting
    from vllm_lookahead.glue.recycling import RecyclingGate
    from vllm_lookahead.glue.step import LookaheadStep

    return Drafting(LookaheadParams(), 1024, 1, ChainBackend(), RecyclingGate(None)), LookaheadStep


def test_no_trees_while_a_prompt_is_prefilled_in_chunks():
    """A request that sampled nothing is mid-prefill: the token budget ran out on prompts, so the decoding requests
    draft nothing this step (drafts would displace prompt tokens); once every request sampled, trees are built."""
    from vllm_lookahead.backends import ChainBackend

    drafting, Step = _drafting()
    runner, requests = _Runner(["a", "b", "c"]), _Requests()
    drafts = drafting.propose(runner, [[5], [], [7]], requests, Step({}, ChainBackend()))
    assert drafts == [[], [], []] and requests.built == []
    drafts = drafting.propose(runner, [[5], [6], [7]], requests, Step({}, ChainBackend()))
    assert requests.built == [5, 6, 7]


def test_a_resting_request_state_is_not_touched_until_it_builds_again():
    """Where nothing is predictable, a resting request costs no catch-up either: its state learns the tokens it
    missed, all at once, at its next tree."""
    from vllm_lookahead.backends import ChainBackend

    drafting, Step = _drafting()
    runner, requests = _Runner(["a", "b"]), _Requests(Rests(longest=3))
    for _ in range(IDLE_AFTER + 2):  # a rests three more steps; b builds (its first trees carry nothing: then rests)
        requests.rests.built("a", carried=False)
    for _ in range(3):
        drafting.propose(runner, [[5], [6]], requests, Step({}, ChainBackend()))
    assert "a" not in requests.touched and requests.touched[:2] == ["b", "b"]
    drafting.propose(runner, [[5], [6]], requests, Step({}, ChainBackend()))
    assert requests.touched.count("a") == 1


def test_without_the_rest_every_request_builds_every_step(monkeypatch):
    """VLLM_LOOKAHEAD_REST=0 (the benchmarks' `lookahead-norest`), read into the engine's settings at start-up: a
    request whose trees carry nothing still builds one every step."""
    from vllm_lookahead.backends import ChainBackend
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.glue.engine import LookaheadEngine
    from vllm_lookahead.glue.settings import Settings

    monkeypatch.setenv("VLLM_LOOKAHEAD_REST", "0")
    settings = Settings.from_env()
    assert settings.max_rest == 0 and Settings().max_rest == MAX_REST
    assert LookaheadEngine(LookaheadParams(), 64, settings=settings).requests.rests.longest == 0
    assert LookaheadEngine(LookaheadParams(), 64, ranks=2).requests.rests.longest == 0  # tensor parallelism
    drafting, Step = _drafting()
    runner, requests = _Runner(["a"]), _Requests(Rests(settings.max_rest))
    for _ in range(6):  # with the rest: built at steps 1, 2, 4 only (`_builds("nnn")`)
        drafting.propose(runner, [[5]], requests, Step({}, ChainBackend()))
    assert requests.touched == ["a"] * 6


def test_a_finished_request_learns_the_tokens_it_rested_through():
    """A request that finishes while resting hands its whole output to the suffix candidates, the tokens it never
    caught up with included."""
    import numpy as np
    from vllm import SamplingParams

    from vllm_lookahead.core.acceptance import AcceptanceStats
    from vllm_lookahead.core.params import LookaheadParams
    from vllm_lookahead.glue.requests import Requests, Shared
    from vllm_lookahead.glue.stats import LookaheadStats

    params = LookaheadParams()
    shared = Shared(AcceptanceStats(), AcceptanceStats(), None, None, None)
    tokens = np.arange(100, 140, dtype=np.int64).reshape(1, -1)

    class Batch:
        req_ids = ["a"]
        req_id_to_index = {"a": 0}
        token_ids_cpu = tokens
        num_prompt_tokens = np.array([20])
        num_tokens_no_spec = np.array([25])

    class Req:
        sampling_params = SamplingParams(temperature=0.0)

    class Runner:
        input_batch = Batch()
        requests = {"a": Req()}

    class Output:
        finished_req_ids = {"a"}
        preempted_req_ids = None

        class scheduled_cached_reqs:  # noqa: N801
            resumed_req_ids: set[str] = set()

    requests = Requests(params, shared, LookaheadStats())
    state = requests.state(Runner(), 0, "a")
    assert state.seen == 25
    for _ in range(IDLE_AFTER + 1):  # resting while it made tokens 25..31
        requests.rests.built("a", carried=False)
    Batch.num_tokens_no_spec = np.array([32])
    requests.drop_finished(Runner(), Output())
    assert state.seen == 32 and state.tail == [130, 131]  # tokens 125..131 learned at the drop
    assert "a" not in requests.states


def test_no_draft_past_a_request_s_max_tokens():
    """A step emits its accepted drafts and one token more: a request with k tokens left to its max_tokens is given
    at most k - 1 drafts (vLLM cuts drafts at max_model_len only), and one with a single token left none."""
    from vllm_lookahead.backends import ChainBackend
    from vllm_lookahead.core.tree import StepTree

    class _Sure(_Requests):
        def state(self, runner: object, index: int, req_id: str) -> object:
            from vllm_lookahead.core.acceptance import AcceptanceStats

            class _State:
                stats = AcceptanceStats()

                def build_tree(self, x0: int, min_score: float = 0.0) -> StepTree:
                    n = 9  # a chain of 8 drafts, each certain
                    return StepTree(list(range(x0, x0 + n)), list(range(-1, n - 1)), list(range(n)), scores=[1.0] * n)

            return _State()

    drafting, Step = _drafting()
    # prompt 4 tokens, 10 tokens so far: 6 outputs, x0 included
    for max_tokens, longest in ((None, 8), (100, 8), (9, 2), (7, 0)):
        runner = _Runner(["a"], max_tokens=max_tokens)
        drafts = drafting.propose(runner, [[5]], _Sure(), Step({}, ChainBackend()))
        assert len(drafts[0]) == longest, (max_tokens, drafts)


def test_a_request_s_state_is_built_after_its_first_token_went_out():
    """The step that samples a request's first token does not index its prompt (that would delay the first token):
    its state is built at the request's next step, and a request already known builds as usual."""
    from vllm_lookahead.backends import ChainBackend

    drafting, Step = _drafting()
    runner, requests = _Runner(["new", "old"]), _Requests()
    requests.states["old"] = None
    runner.input_batch.num_tokens_no_spec = [5, 10]  # "new": 4 prompt tokens and its first token
    drafting.propose(runner, [[5], [6]], requests, Step({}, ChainBackend()))
    assert requests.touched == ["old"]
    runner.input_batch.num_tokens_no_spec = [6, 11]
    drafting.propose(runner, [[7], [8]], requests, Step({}, ChainBackend()))
    assert requests.touched == ["old", "new", "old"]
