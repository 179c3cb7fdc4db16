"""The target's argmax and top tokens over chosen rows of a step's logits, as verification and token recycling read
them (`pick`: both in one call, since recycling's rows are among verification's), in torch and numpy: every
backend's unless it has faster code (the CPU backend's compiled library, `backends.cpu.logit_rows`). On a GPU
(`DeviceLogitRows`) both stay on the device and come back in one copy a call.

The argmax follows vLLM's greedy sampler (`argmax(-1)` of the float32 logits): the first maximal index, NaN counting
as the largest. The constants below were timed on a CPU (docs/results.md, "Tuned constants").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from vllm_lookahead.backends.staging import download, to_device

# The vocabulary's blocks `topk` reduces first: the top k tokens lie in the k blocks with the largest maxima.
TOPK_BLOCK = 128
# Below this vocabulary size, and for at most FEW_ROWS rows, torch's own topk is faster than going through the blocks.
BLOCKED_FROM = 100_000
FEW_ROWS = 4
# Gathering a logits row costs more than its argmax: where the rows asked for are at least 1 / ALL_ROWS_SHARE of
# all, every row's argmax is taken.
ALL_ROWS_SHARE = 3


@dataclass(frozen=True)
class Picks:
    """What `pick` read of each row asked for, in the order asked."""

    argmax: list[int]
    top: list[list[int]] | None  # each row's k largest tokens, largest first; None where k was 0


class LogitRows:
    """argmax / top-k over logits rows with torch (numpy's argmax on a CPU: the same rule, several times faster)."""

    # Whether the rows live where reading one costs a wait for the stream (a GPU): verification then draws a sampled
    # tree's tokens at every node in one batch on the device and reads them in one copy, instead of drawing at the
    # nodes its walk visits (a host, where reads are free and most nodes are never visited).
    on_device: ClassVar[bool] = False

    def pick(self, logits: torch.Tensor, rows: Sequence[int] | None = None, k: int = 0) -> Picks:
        """The argmax of each row of `logits` (of its `rows`, in that order, where given) and, where k > 0, its k
        largest tokens."""
        return Picks(self.argmax(logits, rows), self.topk(logits, k, rows) if k > 0 else None)

    def argmax(self, logits: torch.Tensor, rows: Sequence[int] | None = None) -> list[int]:
        """The argmax of each row of `logits` (of its `rows`, in that order, where given), as vLLM's greedy sampler
        takes it."""
        return _argmax(logits, rows)

    def topk(self, logits: torch.Tensor, k: int, rows: Sequence[int] | None = None) -> list[list[int]]:
        """The k largest tokens of each row of `logits` (of its `rows`, in that order, where given), largest first
        (as `topk(k).indices`, ties aside)."""
        if rows is not None:
            logits = logits.index_select(0, torch.tensor(rows, dtype=torch.long, device=logits.device))
        return _topk(logits, k)


def _argmax(logits: torch.Tensor, rows: Sequence[int] | None) -> list[int]:
    if rows is not None:
        if len(rows) * ALL_ROWS_SHARE >= logits.shape[0]:
            every = _argmax(logits, None)
            return [every[r] for r in rows]
        logits = logits.index_select(0, torch.tensor(rows, dtype=torch.long, device=logits.device))
    if logits.device.type != "cpu":
        return logits.to(torch.float32).argmax(-1).tolist()
    return logits.to(torch.float32).numpy().argmax(-1).tolist()


def _topk(rows: torch.Tensor, k: int) -> list[list[int]]:
    """torch's topk, through the vocabulary's blocks where that is faster: each row's block maxima first, then the
    top k among the k best blocks' tokens (every token at least the k-th largest lies in a block whose maximum is
    too, and at most k blocks have such a maximum). bfloat16 rows are made float32 first (exactly): torch's block
    maxima over bfloat16 are slower on a CPU."""
    r, v = rows.shape
    if (v < BLOCKED_FROM and r <= FEW_ROWS) or k >= v // TOPK_BLOCK:
        return rows.topk(min(k, v), dim=-1).indices.tolist()
    if rows.device.type == "cpu" and rows.dtype != torch.float32:
        rows = rows.to(torch.float32)
    pad = (-v) % TOPK_BLOCK
    if pad:
        rows = torch.nn.functional.pad(rows, (0, pad), value=float("-inf"))
    blocks = rows.view(r, -1, TOPK_BLOCK)
    best = blocks.amax(-1).topk(k, dim=-1).indices  # [r, k] block ids
    tokens = blocks.gather(1, best.unsqueeze(-1).expand(r, k, TOPK_BLOCK)).reshape(r, k * TOPK_BLOCK)
    top = tokens.topk(k, dim=-1).indices  # positions among the best blocks' tokens
    return (best.gather(1, top // TOPK_BLOCK) * TOPK_BLOCK + top % TOPK_BLOCK).tolist()


class DeviceLogitRows(LogitRows):
    """A GPU's: argmax and top k on the device in the logits' own dtype (exact: vLLM's greedy sampler takes the argmax
    of a float32 copy, which holds every half-precision value as it is), read back in one copy a call."""

    on_device = True

    def pick(self, logits: torch.Tensor, rows: Sequence[int] | None = None, k: int = 0) -> Picks:
        if rows is not None:
            logits = logits.index_select(0, to_device(rows, torch.int64, logits.device))
        argmax = logits.argmax(-1)
        if k <= 0:
            return Picks(download(argmax), None)
        top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices
        both = download(torch.cat([argmax.unsqueeze(1), top], dim=1))
        return Picks([r[0] for r in both], [r[1:] for r in both])

    def argmax(self, logits: torch.Tensor, rows: Sequence[int] | None = None) -> list[int]:
        return self.pick(logits, rows).argmax

    def topk(self, logits: torch.Tensor, k: int, rows: Sequence[int] | None = None) -> list[list[int]]:
        top = self.pick(logits, rows, k).top
        assert top is not None
        return top
