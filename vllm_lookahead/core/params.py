"""User-facing lookahead parameters: the one place that defines every key, its default, range and meaning.

`LookaheadParams` is the single source of truth. vLLM's `speculative_config` accepts exactly its fields as keys
(patches/speculative_config.py derives them from here), the README's key table is checked against it by a test,
and the reference decoder takes an instance. Validated once on creation, so the per-step code can trust it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_lookahead.core.tree import window_slots_max

MAX_SEED = 2**63 - 1

# The keys a request may set for itself (SamplingParams.extra_args["lookahead"]); the others are engine-wide (the
# step budget, the cost model, the shared caches' sizes). A request's integer key may not exceed the server's value,
# so that every request's tree fits the num_speculative_tokens the engine was started with; its seed is free.
REQUEST_KEYS = (
    "window_size",
    "ngram_size",
    "guess_set_size",
    "lookup_candidates",
    "lookup_len",
    "suffix_candidates",
    "recycle_candidates",
    "pool_from_prompt",
    "pool_from_output",
    "lookahead_seed",
)
_UNCAPPED = ("lookahead_seed",)


class RequestSettingsError(ValueError):
    """A request's lookahead settings are invalid; `key` names the offending one as the request wrote it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _key(default: Any, lo: float | None, hi: float | None, help: str) -> Any:
    """A field whose metadata carries its allowed range (None for bools) and its one-line meaning. A float range
    makes a float key, which may also be None (its default, "measured")."""
    return field(default=default, metadata={"range": None if lo is None else (lo, hi), "help": help})


PATH = "path"  # the "range" of a key whose value is null or the path of an existing file


def _path_key(help: str) -> Any:
    return field(default=None, metadata={"range": PATH, "help": help})


@dataclass(frozen=True)
class LookaheadParams:
    """W (window_size), N (ngram_size), G (guess_set_size) and the other candidate sources; validated on creation.

    The defaults were chosen from measurements on the default model on CPU (docs/results.md): a step's cost grows
    with its tree there, so a small window plus one long prompt-lookup candidate beats the paper's GPU-sized
    configs (W=15, N=5, G=W for 7B models on an A100).
    """

    window_size: int = _key(4, 1, 64, "columns of the Jacobi window (future positions looked at)")
    ngram_size: int = _key(3, 2, 16, "n-gram length; the window keeps N-1 rows")
    guess_set_size: int = _key(
        4, 0, 64, "most pool candidates (n-grams starting with the last token) verified per step"
    )
    pool_from_prompt: bool = _key(True, None, None, "seed the n-gram pool with the prompt's n-grams")
    pool_from_output: bool = _key(True, None, None, "the pool also learns the n-grams of the accepted output")
    lookup_candidates: int = _key(
        1,
        0,
        8,
        "prompt-lookup candidates (continuations of earlier occurrences of the last 1-3 tokens) added to the tree",
    )
    lookup_len: int = _key(8, 1, 32, "tokens per prompt-lookup candidate")
    suffix_candidates: int = _key(
        16,
        0,
        64,
        "most suffix-tree nodes (continuations of the context in the prompt, the output and earlier requests' "
        "outputs) added to the tree; 0 turns the source off (it is off without arctic_inference)",
    )
    recycle_candidates: int = _key(
        16,
        0,
        64,
        "most token-recycling nodes (the target's own top tokens after each token, kept from earlier steps) added "
        "to the tree; 0 turns the source off",
    )
    suffix_depth: int = _key(24, 1, 64, "suffix-tree depth: longest context matched and longest continuation")
    suffix_cache_requests: int = _key(
        10000,
        0,
        1 << 20,
        "finished requests whose outputs stay suffix-tree candidates for later requests (about 210 bytes per "
        "cached output token)",
    )
    suffix_corpus: str | None = _path_key(
        'JSON Lines file of texts like the outputs expected (a string or an object with a "text" string a line), '
        "held by the global suffix tree from start-up as finished outputs (they count in suffix_cache_requests)"
    )
    shared_pool_keys: int = _key(
        0,
        0,
        1 << 20,
        "keys of an n-gram pool shared by all requests (each request's text and window n-grams, least recently "
        "updated key dropped first); 0 turns it off",
    )
    step_token_budget: int = _key(
        512,
        2,
        1 << 16,
        "most tokens (tree nodes, x0s included) all lookahead requests of one step may carry: a cap on what the "
        "tree sizing chooses",
    )
    node_cost: float | None = _key(
        None,
        0.0,
        10.0,
        "cost of one more token in a step, relative to a one-token step; null: measured from the engine's own "
        "steps (trees then follow the machine, model, dtype and batch); a number fixes it (reproducible trees)",
    )
    lookahead_seed: int = _key(0, 0, MAX_SEED, "seed of the window's initial guesses (drawn from the prompt)")
    max_pool_keys: int = _key(
        4096, 1, 1 << 20, "most keys of a request's n-gram pool (least recently updated dropped first)"
    )

    def __post_init__(self) -> None:
        if isinstance(self.suffix_corpus, str) and self.suffix_corpus:  # as the user meant it, wherever it is read
            object.__setattr__(self, "suffix_corpus", os.path.abspath(os.path.expanduser(self.suffix_corpus)))
        for f in dataclasses.fields(self):
            _check(f.name, getattr(self, f.name), f.metadata["range"])
        if self.suffix_corpus is not None and self.suffix_cache_requests == 0:
            raise ValueError("lookahead: suffix_corpus needs suffix_cache_requests > 0 (the global tree holds it)")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The accepted keys, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls, given: Mapping[str, Any]) -> LookaheadParams:
        """A server's parameters from user keys (e.g. speculative_config's). A key whose value is None takes its
        default; an unknown key is an error naming it and the allowed keys."""
        unknown = sorted(str(k) for k in given if k not in cls.keys())
        if unknown:
            raise ValueError(f"lookahead: unknown key(s) {', '.join(unknown)}; allowed keys: {', '.join(cls.keys())}")
        params = cls(**{k: v for k, v in given.items() if v is not None})
        if params.suffix_corpus is not None and params.suffix_candidates == 0:
            # A request may lower suffix_candidates (its own params may hold 0 with the corpus) but never raise it
            # past the server's: with 0 here no tree could ever draft from the corpus.
            raise ValueError("lookahead: suffix_corpus needs suffix_candidates > 0 (nothing would draft from it)")
        return params

    def for_request(self, given: Any, where: str = "extra_args.lookahead") -> LookaheadParams:
        """This server's parameters with a request's own settings applied (`given`: key -> value, a subset of
        REQUEST_KEYS). An integer key lies in [its minimum, this server's value] (the seed in its full range); a
        key whose value is null keeps the server's value. Raises RequestSettingsError naming the key."""
        if not isinstance(given, Mapping):
            raise RequestSettingsError(
                where, f"{where} must be false, true or an object of lookahead keys (got {given!r})"
            )
        changes: dict[str, Any] = {}
        for key, value in given.items():
            name = f"{where}.{key}"
            if key not in REQUEST_KEYS:
                kind = "is engine-wide (set it in speculative_config)" if key in self.keys() else "is not a key"
                raise RequestSettingsError(name, f"{name} {kind}; a request may set: {', '.join(REQUEST_KEYS)}")
            if value is None:
                continue
            rng = _FIELDS[key].metadata["range"]
            if rng is None:
                if not isinstance(value, bool):
                    raise RequestSettingsError(name, f"{name} must be a bool (got {value!r})")
            else:
                lo, hi = rng[0], rng[1] if key in _UNCAPPED else getattr(self, key)
                if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                    why = "" if key in _UNCAPPED else " (at most the server's value)"
                    raise RequestSettingsError(name, f"{name} must be an integer in [{lo}, {hi}]{why} (got {value!r})")
            changes[key] = value
        return dataclasses.replace(self, **changes) if changes else self

    @property
    def max_tree_nodes(self) -> int:
        """Most nodes (x0 included) any step's tree can have: the unmerged worst case, warm-up included.

        The one tree-size function: config validation derives num_speculative_tokens from it and every tree
        (engine and reference decoder alike) is built within it.
        """
        return (
            window_slots_max(self.window_size, self.ngram_size)
            + self.guess_set_size * (self.ngram_size - 1) * (2 if self.shared_pool_keys else 1)
            + self.lookup_candidates * self.lookup_len
            + self.suffix_candidates
            + self.recycle_candidates
        )


_FIELDS = {f.name: f for f in dataclasses.fields(LookaheadParams)}


def _check(name: str, value: Any, rng: tuple[float, float] | str | None) -> None:
    if rng == PATH:
        if value is not None and not (isinstance(value, str) and os.path.isfile(value)):
            raise ValueError(f"lookahead: {name} must be null or the path of an existing file (got {value!r})")
        return
    if rng is None:
        if not isinstance(value, bool):
            raise ValueError(f"lookahead: {name} must be a bool (got {value!r})")
        return
    lo, hi = rng
    if isinstance(lo, float):
        ok = value is None or (isinstance(value, int | float) and not isinstance(value, bool) and lo <= value <= hi)
        if not ok:
            raise ValueError(f"lookahead: {name} must be null or a number in [{lo}, {hi}] (got {value!r})")
        return
    # bool is a subclass of int; `window_size=True` is surely a mistake, so reject it explicitly.
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"lookahead: {name} must be an integer in [{lo}, {hi}] (got {value!r})")
