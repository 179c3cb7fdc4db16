"""The engine's counters (`engine.worker_stats` reports them with the state of its parts)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_lookahead.core.tree import Source

SOURCE_NAMES = [s.name.lower() for s in Source if s != Source.ROOT]


@dataclass
class LookaheadStats:
    steps: int = 0  # target forward passes (engine steps) this runner made
    tree_steps: int = 0  # request-steps verified on a tree
    accepted: int = 0  # draft tokens accepted on trees
    sampled_accepted: int = 0  # of those, accepted for sampled (temperature > 0) requests
    fallback_requests: int = 0  # requests that took the plain path
    preemptions: int = 0  # requests preempted (their state dropped, rebuilt on their next decode step)
    kernel_attention_steps: int = 0  # steps whose tree rows the backend's fast kernel computed
    reference_attention_steps: int = 0  # steps whose tree rows the plain-torch path recomputed
    # per candidate source (Source names): tree nodes verified, and those accepted
    drafted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCE_NAMES, 0))
    accepted_by: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCE_NAMES, 0))
    # the verified draft nodes' summed scores: against the accepted ones (accepted_by's sum), how far the scores of
    # the nodes steps carry (the best-scored ones) overstate what verification accepts
    carried_score: float = 0.0
