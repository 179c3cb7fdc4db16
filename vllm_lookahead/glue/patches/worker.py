"""Worker: after vLLM's own warm-up (compilation, CUDA graphs), the lookahead engine warms up too
(`LookaheadEngine.warm_up`: the step-cost seed), before the first request."""

from __future__ import annotations

from vllm_lookahead.glue.patches.base import Patch


def _cpu_worker():
    from vllm.v1.worker.cpu_worker import CPUWorker

    return CPUWorker


def _gpu_worker():
    from vllm.v1.worker.gpu_worker import Worker

    return Worker


def _warm_up(original):
    def compile_or_warm_up_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        engine = getattr(self.model_runner, "_lookahead", None)
        if engine is not None:
            engine.warm_up(self.model_runner)
        return result

    return compile_or_warm_up_model


PATCHES = [
    Patch("cpu_worker.compile_or_warm_up_model", _cpu_worker, "compile_or_warm_up_model", _warm_up),
    Patch("gpu_worker.compile_or_warm_up_model", _gpu_worker, "compile_or_warm_up_model", _warm_up),
]
