"""Verification of a step tree: greedy (exact match), sampling by the target's own draws (the path of the tokens
the target samples), and sampling by multi-candidate rejection.

All three return (accepted_nodes, tokens): accepted_nodes are the tree nodes taken, root excluded, in depth order;
tokens are their tokens plus one more token from the target (the bonus / correction), so 1..depth+1 tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from vllm_lookahead.core.tree import StepTree


def greedy_verify(tree: StepTree, argmax: Sequence[int]) -> tuple[list[int], list[int]]:
    """Longest root path whose every token equals the target's argmax at its parent, plus the bonus.

    argmax[u] is the target's argmax at node u (a tensor is converted with one .tolist()). In a merged tree
    children have distinct tokens and this is a single walk; in an unmerged tree several children can match,
    so all matches are explored and the longest path wins (ties: lowest node indices first).
    """
    if isinstance(argmax, torch.Tensor):
        argmax = argmax.tolist()
    tokens = tree.tokens
    children = tree.child_lists
    depths = tree.depths
    best: list[int] = []
    path: list[int] = []
    stack = [0]
    while stack:
        u = stack.pop()
        if u:
            del path[depths[u] - 1 :]
            path.append(u)
            if len(path) > len(best):
                best = path.copy()
        want = argmax[u]
        matches = [c for c in children[u] if tokens[c] == want]
        if matches:
            # Reversed so the lowest index is popped (explored) first.
            stack.extend(reversed(matches))
    last = best[-1] if best else 0
    return best, [tokens[u] for u in best] + [int(argmax[last])]


def draw_verify(tree: StepTree, draw: Callable[[int], int]) -> tuple[list[int], list[int]]:
    """Follow the tokens the target itself samples: draw(u) is the target's token at node u (one random draw);
    if a child of u carries it, the child is accepted and the walk goes on from there, else it is the last token.

    Exact for any sampler: every output token is the target's own sample at its position given the tokens before
    it, so the drafts decide only how many tokens one forward pass yields, never which. draw is called once per
    output token, in order, so a seeded generator is consumed as plain decoding consumes it and the output is
    the one plain decoding would give from the same logits. A child is accepted with probability p(its token):
    over several distinct children, the sum of their probabilities, as for multi-candidate rejection sampling.
    """
    tokens = tree.tokens
    children = tree.child_lists
    accepted: list[int] = []
    out: list[int] = []
    u = 0
    while True:
        t = draw(u)
        out.append(t)
        nxt = next((c for c in children[u] if tokens[c] == t), -1)
        if nxt < 0:
            return accepted, out
        accepted.append(nxt)
        u = nxt


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
