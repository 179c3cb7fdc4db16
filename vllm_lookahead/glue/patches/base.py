"""A patch replaces one attribute of one vLLM object and keeps the original, so that the replacement can delegate
to it and `revert` can restore vLLM exactly."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Patch:
    name: str  # unique, e.g. "runner._sample"
    owner: Callable[[], Any]  # returns the object whose attribute is replaced (imported lazily)
    attr: str
    make: Callable[[Any], Any]  # original -> replacement
    after: Callable[[Any], None] | None = None  # called with the owner once the attribute is set or restored
    when: Callable[[], bool] | None = None  # applied only where this holds (a platform's own classes)


_MISSING = object()  # the attribute did not exist before the patch (the patch adds it)
_originals: dict[str, tuple[Any, str, Any]] = {}


def original(name: str) -> Any:
    """The attribute a patch replaced (raises KeyError if that patch is not applied)."""
    return _originals[name][2]


def applied() -> list[str]:
    return list(_originals)


def apply(patches: Sequence[Patch]) -> None:
    """Apply each patch once; applying an applied patch does nothing (every vLLM process calls the plugin)."""
    for p in patches:
        if p.name in _originals or (p.when is not None and not p.when()):
            continue
        owner = p.owner()
        orig = owner.__dict__.get(p.attr, _MISSING) if isinstance(owner, type) else getattr(owner, p.attr, _MISSING)
        _originals[p.name] = (owner, p.attr, orig)
        new = p.make(orig)
        if orig is not _MISSING:
            try:  # lets anyone tell a patched attribute from vLLM's own
                new.__wrapped__ = orig
            except AttributeError:
                pass
        setattr(owner, p.attr, new)
        if p.after is not None:
            p.after(owner)


def revert(patches: Sequence[Patch]) -> None:
    """Put every original back, last patch first."""
    for p in reversed(patches):
        entry = _originals.pop(p.name, None)
        if entry is None:
            continue
        owner, attr, orig = entry
        if orig is _MISSING:
            delattr(owner, attr)
        else:
            setattr(owner, attr, orig)
        if p.after is not None:
            p.after(owner)
