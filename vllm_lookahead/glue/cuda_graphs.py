"""Which CUDA graphs each kind of step runs under.

A full CUDA graph captures attention, and its replay would never reach the tree kernel, so a step that carries tree
rows must run attention outside graphs: vLLM's dispatcher is asked for that step's graph with FULL excluded
(`patches/cuda_graphs.py`), which gives the piecewise graph where the user's mode captures them (vLLM's default
FULL_AND_PIECEWISE: attention runs between the captured pieces) and no graph otherwise. Every other step (prefill,
plain decode, chains, whatever the engine's backend) keeps the mode the user chose, as vLLM dispatches it: nothing is
changed at start-up, so an engine that ends up running chains has the user's graphs throughout.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_tree_step = False  # a step with tree rows is being dispatched


@contextmanager
def tree_step(active: bool) -> Iterator[None]:
    """While vLLM chooses a step's graph: whether the step carries tree rows (then no full graph)."""
    global _tree_step
    _tree_step = active
    try:
        yield
    finally:
        _tree_step = False


def excluded_modes(valid_modes: Any, invalid_modes: Any) -> tuple[Any, Any]:
    """The dispatcher's (valid_modes, invalid_modes) for the step under way: FULL excluded in a step with tree rows."""
    if not _tree_step:
        return valid_modes, invalid_modes
    from vllm.config.compilation import CUDAGraphMode

    if valid_modes is not None and set(valid_modes) <= {CUDAGraphMode.FULL}:
        valid_modes = {CUDAGraphMode.NONE}  # agreed across data-parallel ranks on a full graph: none for this one
    return valid_modes, {*(invalid_modes or ()), CUDAGraphMode.FULL}


def tree_step_mode(mode: Any) -> Any:
    """The graph a step with tree rows gets at most under the engine's resolved mode: PIECEWISE where the mode
    captures piecewise graphs, else NONE."""
    from vllm.config.compilation import CUDAGraphMode

    return CUDAGraphMode.PIECEWISE if mode.has_piecewise_cudagraphs() else CUDAGraphMode.NONE


def describe(mode: Any, trees: bool, largest: int | None) -> str:
    """The one log line: what graph mode each kind of step gets (mode: the engine's resolved `CUDAGraphMode`;
    largest: the most tokens a captured graph holds)."""
    if mode.name == "NONE":
        return "CUDA graphs are off (cudagraph_mode NONE): every step runs eagerly"
    past = f"; a step of more than {largest} tokens runs without graphs, as in vLLM" if largest else ""
    if not trees:
        return f"every step runs under vLLM's {mode.name} CUDA graphs, as vLLM dispatches it{past}"
    tree = tree_step_mode(mode).name
    return (
        f"steps without tree rows run under vLLM's {mode.name} CUDA graphs, as vLLM dispatches them; steps with tree "
        f"rows run {tree} (no full graph: the tree kernel rewrites attention's output, which a full graph captures)"
        f"{past}"
    )
