"""Resting: a request whose trees carry no draft builds its next trees only every so many steps.

Where nothing is predictable (random text, sampling at temperature 1, a large batch on a CPU), building trees nobody
carries, and catching each state up a token at a time, is most of what the plugin costs a step. From the IDLE_AFTER-th
tree in a row that carried nothing, a request rests 1, 2, 4, ... steps, at most `longest` (MAX_REST unless set
otherwise, `settings.py`), so that a source that starts to match is found again within that many steps. A tree that
carries drafts ends the rest. A resting request's state learns the tokens it missed when it next builds a tree, or
when it finishes, all at once (`requests.py`). The values: docs/results.md, "Tuned constants".
"""

from __future__ import annotations

IDLE_AFTER = 2
MAX_REST = 8


class Rests:
    """Each idle request's (trees in a row that carried nothing, steps left to rest)."""

    def __init__(self, longest: int = MAX_REST) -> None:
        self.longest = longest  # 0: no request ever rests (tensor parallelism: every rank builds the same trees)
        self._idle: dict[str, tuple[int, int]] = {}

    def __contains__(self, req_id: str) -> bool:
        """Whether the request's last tree carried nothing: its state may lag its tokens."""
        return req_id in self._idle

    def resting(self, req_id: str) -> bool:
        """Whether the request skips building a tree this step (the step counted off its rest)."""
        empty, rest = self._idle.get(req_id, (0, 0))
        if rest <= 0:
            return False
        self._idle[req_id] = (empty, rest - 1)
        return True

    def built(self, req_id: str, carried: bool) -> None:
        """The request's new tree carried drafts (`carried`) or nothing. Where no request rests (tensor
        parallelism), none is marked idle either: what a rank's tree carried follows its own sizes, and a request
        marked idle on one rank only would be caught up at its end there alone, its shared suffix tree and pool then
        different from the driver's."""
        if carried or self.longest <= 0:
            self._idle.pop(req_id, None)
            return
        empty = self._idle.get(req_id, (0, 0))[0] + 1
        rest = min(1 << min(empty - IDLE_AFTER, 30), self.longest) if empty >= IDLE_AFTER else 0
        self._idle[req_id] = (empty, rest)

    def forget(self, req_id: str) -> None:
        self._idle.pop(req_id, None)
