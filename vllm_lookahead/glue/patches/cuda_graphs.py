"""CUDA graphs: a step with tree rows is dispatched without full graphs, every other step as vLLM dispatches it
(`glue/cuda_graphs.py` says why and what each kind of step gets).

- `GPUModelRunner._determine_batch_execution_and_padding` (vLLM chooses a step's graph right after
  `_prepare_inputs`, where the engine learnt whether the step carries tree rows) runs inside
  `cuda_graphs.tree_step`;
- `CudagraphDispatcher.dispatch` excludes FULL inside it.
Both are pass-throughs without lookahead and outside steps with tree rows.
"""

from __future__ import annotations

from vllm_lookahead.glue import cuda_graphs
from vllm_lookahead.glue.patches.base import Patch


def _runner():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


def _dispatcher():
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    return CudagraphDispatcher


def _determine(original):
    def _determine_batch_execution_and_padding(self, *args, **kwargs):
        engine = getattr(self, "_lookahead", None)
        with cuda_graphs.tree_step(engine is not None and engine.step_has_trees()):
            return original(self, *args, **kwargs)

    return _determine_batch_execution_and_padding


def _dispatch(original):
    def dispatch(self, num_tokens, *args, valid_modes=None, invalid_modes=None, **kwargs):
        valid_modes, invalid_modes = cuda_graphs.excluded_modes(valid_modes, invalid_modes)
        return original(self, num_tokens, *args, valid_modes=valid_modes, invalid_modes=invalid_modes, **kwargs)

    return dispatch


PATCHES = [
    Patch(
        "runner._determine_batch_execution_and_padding",
        _runner,
        "_determine_batch_execution_and_padding",
        _determine,
    ),
    Patch("cudagraph_dispatcher.dispatch", _dispatcher, "dispatch", _dispatch),
]
