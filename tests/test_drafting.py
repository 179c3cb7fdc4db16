"""Drafting's rest for requests whose trees carry nothing (no engine)."""

from __future__ import annotations

from vllm_lookahead.glue.drafting import IDLE_AFTER, MAX_REST, _carried_nothing, _resting


def _builds(pattern: str) -> str:
    """Replay a run: at each step the request builds a tree unless resting; 'n' a tree that carried nothing, 'd' one
    that carried drafts. Returns which steps built ('b') or rested ('.')."""
    idle: dict[str, tuple[int, int]] = {}
    out, it = [], iter(pattern)
    for _ in range(len(pattern) * 4):
        if _resting(idle, "r"):
            out.append(".")
            continue
        kind = next(it, None)
        if kind is None:
            break
        out.append("b")
        if kind == "d":
            idle.pop("r", None)
        else:
            _carried_nothing(idle, "r")
    return "".join(out)


def test_empty_trees_rest_longer_up_to_a_cap_and_drafts_end_the_rest():
    assert (IDLE_AFTER, MAX_REST) == (2, 3)
    assert _builds("nnnnnn") == "bb.b..b...b...b..."  # rests of 1, 2, then 3 steps at most
    assert _builds("dddd") == "bbbb"  # requests that draft never rest
    assert _builds("nnndnnn") == "bb.b..bbb.b.."  # a tree that carried drafts starts the count again
