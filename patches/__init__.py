"""Everything that changes vLLM's behaviour, as small named patches applied by the plugin at load.

Each patch replaces one attribute of one vLLM object and keeps the original (`original(name)`), so that
the replacement can delegate to it and `revert_all()` can restore vLLM exactly. The patches are written
against one vLLM release (`vllm_lookahead.SUPPORTED_VLLM_VERSION`) and are only applied on that release.
Every replacement is a pass-through unless the engine was started with `method: "lookahead"`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Patch:
    name: str  # unique, e.g. "runner._sample"
    owner: Callable[[], Any]  # returns the object whose attribute is replaced (imported lazily)
    attr: str
    make: Callable[[Any], Any]  # original -> replacement
    after: Callable[[Any], None] | None = None  # called with the owner once the attribute is set


_MISSING = object()  # the attribute did not exist before the patch (the patch adds it)
_originals: dict[str, tuple[Any, str, Any]] = {}


def original(name: str) -> Any:
    """The attribute a patch replaced (raises KeyError if that patch is not applied)."""
    return _originals[name][2]


def applied() -> list[str]:
    return list(_originals)


def all_patches() -> list[Patch]:
    from patches import attention, cli, model_runner, speculative_config

    return [*speculative_config.PATCHES, *cli.PATCHES, *model_runner.PATCHES, *attention.PATCHES]


def apply_all() -> None:
    """Apply every patch once; later calls (every vLLM process calls the plugin) do nothing."""
    for p in all_patches():
        if p.name in _originals:
            continue
        owner = p.owner()
        if isinstance(owner, type):
            orig = owner.__dict__.get(p.attr, _MISSING)
        else:
            orig = getattr(owner, p.attr, _MISSING)
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


def revert_all() -> None:
    """Put every original back (tests use this to show the plugin is inert)."""
    for p in reversed(all_patches()):
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
