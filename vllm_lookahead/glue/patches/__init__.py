"""Every replacement of vLLM code, as small named patches applied by the plugin at load.

Each patch replaces one attribute of one vLLM object and keeps the original (`original(name)`), so that the
replacement can delegate to it and `revert_all()` restores vLLM exactly. The patches are written against one vLLM
release (`vllm_lookahead.SUPPORTED_VLLM_VERSION`) and the plugin applies them only on that release. Every
replacement is a pass-through unless the engine was started with `method: "lookahead"`.
"""

from __future__ import annotations

from vllm_lookahead.glue.patches import (
    attention,
    cli,
    cpu_sampling,
    cuda_graphs,
    draft_transfer,
    model_runner,
    requests,
    scheduler,
    speculative_config,
    worker,
)
from vllm_lookahead.glue.patches.base import Patch, applied, apply, original, revert

__all__ = ["PATCHES", "Patch", "applied", "apply_all", "original", "revert_all"]

PATCHES: list[Patch] = [
    *speculative_config.PATCHES,
    *cli.PATCHES,
    *model_runner.PATCHES,
    *attention.PATCHES,
    *cuda_graphs.PATCHES,
    *cpu_sampling.PATCHES,
    *scheduler.PATCHES,
    *requests.PATCHES,
    *draft_transfer.PATCHES,
    *worker.PATCHES,
]


def apply_all() -> None:
    apply(PATCHES)


def revert_all() -> None:
    """Tests use this to show the plugin is inert."""
    revert(PATCHES)
