"""Verification of a step tree by multi-candidate rejection sampling (SpecInfer-style), the reference decoder's
sampled verification (`reference_decoder.py`): the target's distribution at every node given as a matrix, as the
engine's own path (`core.verify.draw_verify`, one draw per output token) never has it.

Returns (accepted_nodes, tokens) as `core.verify`'s functions do.
"""

from __future__ import annotations

import torch

from vllm_lookahead.core.tree import StepTree


def sample_verify(
    tree: StepTree, probs: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[list[int], list[int]]:
    """Exact speculative sampling over the tree with deterministic drafts (SpecInfer-style).

    probs[u] is the target distribution at node u (after temperature/top-k/top-p), shape [num_nodes, vocab]
    (rows need not be normalised). At node u the residual q starts as probs[u]; children are tried in node
    order, one per distinct token t: accept with probability q[t] / sum(q), else zero q[t]. On acceptance move
    to the child; when no child is accepted (or u is a leaf) sample the final token from the residual.

    Why exact: trying distinct tokens t1, t2, ... this way outputs t_j with probability p(t_j) and any other
    token x with probability (1 - sum_j p(t_j)) * p(x) / (1 - sum_j p(t_j)) = p(x); after accepting t the next
    distribution is the target's conditional given t, which is probs[child].

    All randomness comes from `generator` (one uniform per node, drawn in a single call): node c's uniform
    decides c's trial, which happens at most once, and node 0's (the root is never tried) drives the final
    draw. Host syncs: one transfer of n uniforms, tried probabilities and row sums, then one for the final
    draw; the walk itself is plain Python.
    """
    n = tree.num_nodes
    if probs.dim() != 2 or probs.shape[0] < n:
        raise ValueError(f"lookahead: probs must be [num_nodes >= {n}, vocab] (got {tuple(probs.shape)})")
    tokens = tree.tokens
    children = tree.child_lists
    device = probs.device
    if generator is not None:
        uniforms = torch.rand(n, generator=generator, dtype=torch.float64, device=generator.device)
        if uniforms.device != device:
            uniforms = uniforms.to(device)
    else:
        uniforms = torch.rand(n, dtype=torch.float64, device=device)
    # p_tok[c] = probability of c's token under its parent's distribution (entry 0, the root's, is unused).
    vocab = probs.shape[1]
    flat = [max(p, 0) * vocab + t for p, t in zip(tree.parents, tokens, strict=True)]
    p_tok = probs.reshape(-1)[torch.tensor(flat, device=device)]
    # Summed in the input's dtype (a float64 accumulator is ~15x slower on CPU): the error is at the level of
    # the probabilities' own rounding.
    row_mass = probs[:n].sum(dim=-1)
    # One device-to-host transfer for everything the walk needs (cat promotes to float64).
    host = torch.cat([uniforms, p_tok, row_mass]).tolist()
    uniforms_l, p_tok_l, row_mass_l = host[:n], host[n : 2 * n], host[2 * n :]

    accepted: list[int] = []
    out: list[int] = []
    u = 0
    while True:
        mass = row_mass_l[u]
        rejected: list[int] = []
        nxt = -1
        for c in children[u]:
            t = tokens[c]
            if t in rejected:
                continue  # unmerged duplicate: its token already has zero residual mass
            pt = p_tok_l[c]
            if pt > 0.0 and uniforms_l[c] * mass < pt:
                nxt = c
                break
            rejected.append(t)
            mass -= pt
        if nxt < 0:
            break
        accepted.append(nxt)
        out.append(tokens[nxt])
        u = nxt

    row = probs[u].double()
    if rejected:
        row = row.clone()
        row[torch.tensor(rejected, device=device)] = 0.0
    out.append(_sample_row(row, uniforms_l[0], probs[u]))
    return accepted, out


def _sample_row(row: torch.Tensor, uniform: float, fallback: torch.Tensor | None) -> int:
    """Inverse-CDF draw from an unnormalised float64 row; zero-probability tokens are never chosen."""
    cdf = torch.cumsum(row, dim=0)
    total = cdf[-1:]
    # right=True: the first index whose cdf exceeds x, which can never be a zero-probability token.
    i = torch.searchsorted(cdf, total * uniform, right=True)
    i_host, total_host = torch.cat([i.to(cdf.dtype), total]).tolist()
    if not total_host > 0.0:
        # Only reachable through rounding (all residual mass was in rejected tokens): use the target itself.
        if fallback is None:
            raise ValueError("lookahead: a target distribution has no probability mass")
        return _sample_row(fallback.double(), uniform, None)
    if i_host >= row.shape[0]:
        # uniform * total rounded up to total: take the last token with mass.
        return int(torch.nonzero(row > 0)[-1])
    return int(i_host)
