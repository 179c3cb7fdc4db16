"""Moving a step's host-built data to the device and back without waiting on the GPU more than once each way.

A step builds its tree positions, kernel descriptors and KV move indices on the host. Each goes to the device as one
buffer in one copy (`upload`) from page-locked memory (`host_empty`), which the copy engine reads while the stream
runs: a copy from pageable memory waits for the stream first. Torch's caching host allocator keeps a pinned block
until the copy that reads it has run, so a buffer per step is safe and cheap. What the host needs of the device
(tokens, draws) comes back in one copy a step (`download`). On a CPU every call is a plain tensor operation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def host_empty(shape: int | tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host buffer for data bound for `device`: page-locked where the device is a GPU."""
    return torch.empty(shape, dtype=dtype, pin_memory=device.type == "cuda")


def to_device(values: Sequence[int] | np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host values (a list, an array) on `device` through a page-locked buffer: one copy."""
    host = host_empty(len(values), dtype, device)
    host.numpy()[:] = values
    return upload(host, device)


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` on `device`: one copy that does not wait for the stream where `host` is page-locked (`host_empty`)."""
    return host.to(device, non_blocking=True)


def download(values: torch.Tensor) -> list:
    """A device tensor's values on the host: the one copy (and wait for the stream) of the step that needs them."""
    return values.tolist()
