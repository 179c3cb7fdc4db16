"""Verification of a step tree: greedy (exact match) and sampling by the target's own draws (the path of the tokens
the target samples). (Multi-candidate rejection sampling, which the reference decoder uses, is
`devtools/rejection_sampling.py`.)

Both return (accepted_nodes, tokens): accepted_nodes are the tree nodes taken, root excluded, in depth order;
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
