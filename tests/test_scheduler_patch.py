"""The scheduler patch: a step that admits a waiting request carries no drafts for the running ones (its user waits
for that whole step), once per request at the head of the queue."""

from __future__ import annotations

from types import SimpleNamespace

from vllm.v1.core.sched.interface import PauseState

from vllm_lookahead.glue.patches.scheduler import SchedulerState, _drop_drafts_for_admission, state_of


class _Queue(list):
    def peek_request(self):
        return self[0]


def _scheduler(waiting: list[str], drafts: list[list[int]], max_active: int = 4, paused: bool = False):
    return SimpleNamespace(
        waiting=_Queue(SimpleNamespace(request_id=r) for r in waiting),
        running=[SimpleNamespace(spec_token_ids=list(d)) for d in drafts],
        num_waiting_for_streaming_input=0,
        max_num_active_reqs=max_active,
        _pause_state=PauseState.PAUSED_NEW if paused else PauseState.UNPAUSED,
        _lookahead=SchedulerState(),
    )


def _drafts(s) -> list[list[int]]:
    return [r.spec_token_ids for r in s.running]


def test_a_step_that_admits_a_request_carries_no_drafts():
    s = _scheduler(["new"], [[5, 6, 7], [8]])
    kept = s.running[0].spec_token_ids
    _drop_drafts_for_admission(s, state_of(s))
    assert _drafts(s) == [[], []]
    assert kept == [5, 6, 7]  # a new list: the old one may be the runner's output
    assert state_of(s).admitting == "new"


def test_a_request_that_stays_waiting_does_not_stop_drafting():
    s = _scheduler(["stuck"], [[5, 6]])
    _drop_drafts_for_admission(s, state_of(s))
    s.running[0].spec_token_ids = [7, 8]  # the next step's drafts; "stuck" was not admitted (no KV blocks)
    _drop_drafts_for_admission(s, state_of(s))
    assert _drafts(s) == [[7, 8]]
    s.waiting.insert(0, SimpleNamespace(request_id="other"))  # a new head of the queue drops them again
    _drop_drafts_for_admission(s, state_of(s))
    assert _drafts(s) == [[]]


def test_drafts_stay_where_nothing_is_admitted():
    for s in (
        _scheduler([], [[5, 6]]),  # nobody waiting
        _scheduler(["new"], [[5, 6], [7]], max_active=2),  # no free slot
        _scheduler(["new"], [[5, 6]], paused=True),  # new requests paused
    ):
        _drop_drafts_for_admission(s, state_of(s))
        assert _drafts(s)[0] == [5, 6]
        assert state_of(s).admitting is None


def test_a_trickle_into_a_large_batch_keeps_its_drafts():
    """Into 16 running requests, 3 waiting ones (under a quarter) do not stop the batch's drafts: at a large batch a
    request arrives at nearly every step, which would drop nearly every step's drafts; 4 waiting (a first wave, or a
    queue building up) do."""
    trickle = _scheduler(["a", "b", "c"], [[5, 6]] * 16, max_active=20)
    _drop_drafts_for_admission(trickle, state_of(trickle))
    assert _drafts(trickle) == [[5, 6]] * 16 and state_of(trickle).admitting is None
    queue = _scheduler(["a", "b", "c", "d"], [[5, 6]] * 16, max_active=20)
    _drop_drafts_for_admission(queue, state_of(queue))
    assert _drafts(queue) == [[]] * 16 and state_of(queue).admitting == "a"
