"""The target's argmax and top tokens over a step's logits rows, as verification and token recycling read them.

The argmax follows vLLM's greedy sampler (`argmax(-1)` of the float32 logits): the first maximal index, NaN counting
as the largest. On a CPU both come from the compiled library (`backends.cpu.kernel`, `csrc/row_select.cpp`), which
reads each row once in its own dtype; torch's topk sorts index-value pairs and its argmax over bfloat16 rows goes
through a float32 copy. Where the library is not loaded (no compiler, `VLLM_LOOKAHEAD_TREE_KERNEL=0`) and on a GPU,
numpy's or torch's own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# torch's path (no library): the vocabulary's blocks `row_topk` reduces first, since the top k tokens lie in the k
# blocks with the largest maxima.
TOPK_BLOCK = 128
# Below this vocabulary size, and for at most FEW_ROWS rows, torch's own topk is faster than going through the blocks.
# Timed right after a forward pass, as verification runs it (2-core AVX-512 CPU, bfloat16 and float32): 49k tokens,
# 1-4 rows, 85-137 us against 136-207 through the blocks; 16 rows 373-418 against 269-348; 152k tokens, 1-4 rows,
# 218-431 against 161-279.
BLOCKED_FROM = 100_000
FEW_ROWS = 4


def _library(matrix: torch.Tensor, k: int):  # -> TreeKernel | None
    """The compiled library where it reads this matrix and this k, else None."""
    if matrix.device.type != "cpu":
        return None
    from vllm_lookahead.backends.cpu import kernel

    lib = kernel.load()
    if lib is None or not kernel.takes_rows(matrix) or not 1 <= k <= min(lib.max_k, matrix.shape[1]):
        return None
    return lib


# Without the library, gathering a logits row costs about twice its argmax on a CPU (16 rows of a 49k vocabulary: 92
# against 42 us): where the rows asked for are at least 1 / ALL_ROWS_SHARE of all, every row's argmax is taken.
ALL_ROWS_SHARE = 3


def row_argmax(logits: torch.Tensor, rows: Sequence[int] | None = None) -> list[int]:
    """The argmax of each row of `logits` (of its `rows`, in that order, where given) as vLLM's greedy sampler takes
    it. Without the library: numpy's argmax (the same rule, several times faster than torch's on a CPU: about 0.06
    against 0.4 ms for 20 rows of a 49k vocabulary), torch's on a GPU."""
    lib = _library(logits, 1)
    if lib is not None:
        return lib.top_k(logits, 1, rows)[:, 0].tolist()
    if rows is not None:
        if len(rows) * ALL_ROWS_SHARE >= logits.shape[0]:
            every = row_argmax(logits)
            return [every[r] for r in rows]
        logits = logits.index_select(0, torch.tensor(rows, dtype=torch.long, device=logits.device))
    if logits.device.type != "cpu":
        return logits.to(torch.float32).argmax(-1).tolist()
    return logits.to(torch.float32).numpy().argmax(-1).tolist()


def row_topk(logits: torch.Tensor, k: int, rows: Sequence[int] | None = None) -> list[list[int]]:
    """The k largest tokens of each row of `logits` (of its `rows`, in that order, where given), largest first (as
    `topk(k).indices`, ties aside)."""
    lib = _library(logits, k)
    if lib is not None:
        return lib.top_k(logits, k, rows).tolist()
    if rows is not None:
        logits = logits.index_select(0, torch.tensor(rows, dtype=torch.long, device=logits.device))
    return _torch_topk(logits, k)


def _torch_topk(rows: torch.Tensor, k: int) -> list[list[int]]:
    """torch's topk, through the vocabulary's blocks where that is faster: each row's block maxima first, then the
    top k among the k best blocks' tokens (every token at least the k-th largest lies in a block whose maximum is
    too, and at most k blocks have such a maximum). bfloat16 rows are made float32 first (exactly): torch's block
    maxima over bfloat16 take six times as long on a CPU."""
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
