"""The CUDA backend's step waits for the GPU a fixed number of times, however many trees and nodes it carries.

A step through the CUDA path (`devtools/cuda_step.py`: tree positions, kernel descriptors, every layer's attention,
greedy or sampled verification, KV moves) runs on CPU tensors, those that live on the GPU in vLLM marked as device
tensors (`Device`). A torch function mode counts every host read of a device tensor (`item`, `tolist`, `cpu`,
`numpy`, `bool`, `int`, `float`, `index`: each a wait for the stream on a GPU) and every host tensor that reaches
the device (an explicit `.to(device, non_blocking=True)` upload, or a host tensor handed to an operation on device
tensors, which a GPU copies first, waiting); device factories (`torch.empty(..., device=...)`) make device tensors.
The Triton launches are recorded instead of run (they take device pointers and Python ints only). The counts of a
step with 1 tree equal those with 32 trees, and with 16 nodes those with 128, greedy and sampled (half of the
sampled requests seeded).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from vllm_lookahead.devtools import cuda_step

READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__"}
FACTORIES = {"empty", "zeros", "ones", "full", "arange", "randn", "empty_like", "zeros_like", "full_like"}


class Device(torch.Tensor):
    """A CPU tensor standing for one on the GPU (torch keeps the subclass through every operation on it)."""


class HostSyncs(TorchFunctionMode):
    """Counts host reads of device tensors and host tensors reaching the device."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()
        self.uploads: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_device = [t for t in tensors if isinstance(t, Device)]
        if name in READS and args and isinstance(args[0], Device):
            self.reads[name] += 1
        if name == "to" and kwargs.get("non_blocking") and args and type(args[0]) is torch.Tensor:
            self.uploads["upload"] += 1
            return func(*args, **kwargs).as_subclass(Device)
        if name == "tensor" and kwargs.get("device") is not None:
            self.uploads["torch.tensor(device=)"] += 1
            return func(*args, **kwargs).as_subclass(Device)
        if on_device:
            for t in tensors:
                if type(t) is torch.Tensor and t.dim() > 0:
                    self.uploads[f"host tensor into {name}"] += 1
        out = func(*args, **kwargs)
        if name in FACTORIES and (kwargs.get("device") is not None or any(isinstance(a, Device) for a in args[:1])):
            return out.as_subclass(Device) if type(out) is torch.Tensor else out
        return out


def _device(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(Device)


def _counts(config: cuda_step.Config) -> tuple[Counter[str], Counter[str], list[list[int]]]:
    """One step's host reads and uploads, after a first step has built what a backend keeps across steps."""
    rig = cuda_step.make_rig(config, _device)
    with cuda_step.kernels_recorded() as launched:
        cuda_step.step(rig)
        mode = HostSyncs()
        with mode:
            sampled = cuda_step.step(rig)
    assert {name for name, _ in launched} >= {"tree", "moves"}
    return mode.reads, mode.uploads, cuda_step.outputs(sampled)


SIZES = {"trees": [(1, 16), (32, 16)], "nodes": [(2, 16), (2, 128)]}


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("grow", list(SIZES))
def test_host_syncs_per_step_do_not_grow_with_trees_or_nodes(grow: str, sampled: bool):
    seen = []
    for num_trees, num_nodes in SIZES[grow]:
        reads, uploads, outputs = _counts(cuda_step.Config(num_trees, num_nodes, sampled=sampled))
        assert all(out == [40, 41, 42, 43, 7] for out in outputs), outputs  # every tree took its path and bonus
        seen.append((dict(reads), dict(uploads)))
    assert seen[0] == seen[1], seen
    reads, uploads = seen[0]
    # One read: the rows' argmax and top tokens in one copy; sampled, the trees' draws (with the x0 draws) in another.
    assert reads == {"tolist": 1 + sampled}, reads
    # Uploads: the positions, the descriptors, the output rows, the KV moves; sampled, the rows' index, the draws'
    # rows and requests, and the stand-in's x0 rows.
    assert uploads == {"upload": 4 + 3 * sampled}, uploads


def test_descriptors_are_built_once_before_the_forward_pass(monkeypatch: pytest.MonkeyPatch):
    """`prepare` (at `begin_step`) builds the kernel's descriptors, one `TreeBatch` per head shape; no layer's
    attention builds them again."""
    from vllm_lookahead.backends.cuda import tree_kernel
    from vllm_lookahead.backends.cuda.backend import CudaTreeBackend

    rig = cuda_step.make_rig(cuda_step.Config(3, 16, num_layers=3))
    built, in_forward = [], []
    build, attend = tree_kernel.TreeBatch.build, CudaTreeBackend.attend

    def counted_build(*args: Any, **kwargs: Any) -> Any:
        built.append(bool(in_forward))
        return build(*args, **kwargs)

    def marked_attend(self: Any, *args: Any, **kwargs: Any) -> Any:
        in_forward.append(1)
        return attend(self, *args, **kwargs)

    monkeypatch.setattr(tree_kernel.TreeBatch, "build", staticmethod(counted_build))
    monkeypatch.setattr(CudaTreeBackend, "attend", marked_attend)
    with cuda_step.kernels_recorded() as launched:
        cuda_step.step(rig)
    assert built == [False] and len(in_forward) == 3
    assert [name for name, _ in launched].count("tree") == 3
