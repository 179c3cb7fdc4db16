"""User-facing lookahead parameters, validated once so the per-step code can trust them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_lookahead.tree import max_tree_size

# Chosen from measurements on the default model on CPU (README, "Choosing the defaults"): a step's cost grows with
# its tree, so a small window plus one long prompt-lookup candidate (24 nodes) beats the paper's GPU-sized
# configs (W=15, N=5, G=W for 7B models on A100) here.
DEFAULT_WINDOW_SIZE = 4
DEFAULT_NGRAM_SIZE = 3
DEFAULT_GUESS_SET_SIZE = 4
DEFAULT_MAX_POOL_KEYS = 4096
DEFAULT_LOOKUP_CANDIDATES = 1
DEFAULT_LOOKUP_LEN = 8
MAX_LOOKUP_CANDIDATES = 8
MAX_LOOKUP_LEN = 32
DEFAULT_STEP_TOKEN_BUDGET = 24
MAX_STEP_TOKEN_BUDGET = 1 << 16

# Sanity bounds: beyond these a step's tree (W + G) * (N - 1) is far past any useful size and most likely a
# typo; they also keep per-request memory bounded.
MAX_WINDOW_SIZE = 64
MAX_NGRAM_SIZE = 16
MAX_GUESS_SET_SIZE = 64
MAX_SEED = 2**63 - 1
MAX_POOL_KEYS = 1 << 20


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    # bool is a subclass of int; `window_size=True` is surely a mistake, so reject it explicitly.
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"lookahead: {name} must be an integer in [{lo}, {hi}] (got {value!r})")


@dataclass(frozen=True)
class LookaheadParams:
    """W (window_size), N (ngram_size), G (guess_set_size) plus pool/seed options, validated on creation."""

    window_size: int = DEFAULT_WINDOW_SIZE
    ngram_size: int = DEFAULT_NGRAM_SIZE
    guess_set_size: int = DEFAULT_GUESS_SET_SIZE
    pool_from_prompt: bool = True
    # Also learn the n-grams of the accepted output (prompt lookup on the text so far): free candidates.
    pool_from_output: bool = True
    # Prompt-lookup candidates (continuations of earlier occurrences of the last tokens) added to the tree.
    lookup_candidates: int = DEFAULT_LOOKUP_CANDIDATES
    lookup_len: int = DEFAULT_LOOKUP_LEN
    # Most tokens (tree nodes, x0s included) the lookahead requests of one engine step may carry together; trees
    # shrink to share it and vanish below two nodes each, so large batches, where the target pass is
    # compute-bound, decode plainly instead of paying for guesses.
    step_token_budget: int = DEFAULT_STEP_TOKEN_BUDGET
    seed: int = 0
    max_pool_keys: int = DEFAULT_MAX_POOL_KEYS

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        _check_int("window_size", self.window_size, 1, MAX_WINDOW_SIZE)
        _check_int("ngram_size", self.ngram_size, 2, MAX_NGRAM_SIZE)
        _check_int("guess_set_size", self.guess_set_size, 0, MAX_GUESS_SET_SIZE)
        for name in ("pool_from_prompt", "pool_from_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"lookahead: {name} must be a bool (got {getattr(self, name)!r})")
        _check_int("lookup_candidates", self.lookup_candidates, 0, MAX_LOOKUP_CANDIDATES)
        _check_int("lookup_len", self.lookup_len, 1, MAX_LOOKUP_LEN)
        _check_int("step_token_budget", self.step_token_budget, 2, MAX_STEP_TOKEN_BUDGET)
        _check_int("seed", self.seed, 0, MAX_SEED)
        _check_int("max_pool_keys", self.max_pool_keys, 1, MAX_POOL_KEYS)

    @classmethod
    def allowed_keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> LookaheadParams:
        """Build from a user mapping (e.g. speculative_config extras); unknown keys are errors."""
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise ValueError(f"lookahead: config must be a mapping (got {type(d).__name__})")
        allowed = cls.allowed_keys()
        unknown = sorted(str(k) for k in d if k not in allowed)
        if unknown:
            raise ValueError(
                f"lookahead: unknown config key(s) {', '.join(unknown)}; allowed keys: {', '.join(allowed)}"
            )
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def tree_size(self) -> int:
        """Most tree nodes one step can need (unmerged worst case, warm-up included); a buffer bound."""
        return max_tree_size(self.window_size, self.ngram_size, self.guess_set_size) + (
            self.lookup_candidates * self.lookup_len
        )
