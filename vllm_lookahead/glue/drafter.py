"""The drafter object vLLM's runner holds for a lookahead engine.

vLLM builds it as a `custom_class` proposer; the drafts themselves come from the runner's LookaheadEngine
(patches/model_runner.py routes `propose_draft_token_ids` there), because they need this step's logits at the
window nodes, which vLLM does not hand to a drafter.
"""

from __future__ import annotations

from typing import Any


class LookaheadDrafter:
    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config

    def load_model(self, model: Any) -> None:
        """No draft model: lookahead drafts from the target's own outputs."""

    def propose(self, *args: Any, **kwargs: Any) -> list[list[int]]:
        raise RuntimeError("vllm-lookahead: drafts come from the runner's LookaheadEngine, not the drafter")
