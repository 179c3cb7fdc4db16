"""vLLM plugin entry point (group `vllm.general_plugins`).

vLLM calls `register()` in every process it starts (API server, engine core, each worker), possibly more than
once, so it must be idempotent and cheap. It must also be inert for runs that do not ask for lookahead.
"""

from __future__ import annotations

import logging

from vllm_lookahead import SUPPORTED_VLLM_VERSION

logger = logging.getLogger("vllm_lookahead")

_registered = False


def installed_vllm_version() -> str | None:
    """The vLLM release in this environment without its local tag ("0.32.0+cpu" -> "0.32.0"), or None."""
    try:
        import vllm
    except ImportError:
        return None
    return str(getattr(vllm, "__version__", "")).split("+", 1)[0] or None


def version_supported() -> bool:
    """Whether the installed vLLM is the supported release (its local tag aside)."""
    return installed_vllm_version() == SUPPORTED_VLLM_VERSION


def register() -> None:
    """Entry point: on the supported vLLM, apply the patches (each a pass-through unless lookahead is asked
    for); on another release stay inert and say so once."""
    global _registered
    if _registered:
        return
    _registered = True
    if not version_supported():
        logger.warning(
            "vllm-lookahead: vLLM %s is not the supported %s; the plugin stays inert and "
            "method 'lookahead' is unavailable.",
            installed_vllm_version(),
            SUPPORTED_VLLM_VERSION,
        )
        return
    from vllm_lookahead.glue import patches

    _log_through_vllm()
    patches.apply_all()


def _log_through_vllm() -> None:
    """Our log lines (which path lookahead runs and why, the reasons for plain decoding) printed as vLLM prints its
    own: its handler and level, in every process. They still propagate, so a handler of the user's sees them too."""
    vllm_logger = logging.getLogger("vllm")
    if logger.handlers or not vllm_logger.handlers:
        return
    for handler in vllm_logger.handlers:
        logger.addHandler(handler)
    logger.setLevel(vllm_logger.level)
