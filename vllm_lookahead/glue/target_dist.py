"""The target's own next-token draw at a node of a sampled request's tree, made the way vLLM's sampler makes it.

vLLM's `Sampler` turns a request's row of logits into its next token in this order: float32, temperature, the
argmax-invariant logits processors (min-p, built in), then `TopKTopPSampler`: top-k and top-p, and one random draw
(on CPU: one seed from the request's generator, or the global one, then a Gumbel-max over the logits). `draw` runs
those steps on one tree node's row, with the request's values read from vLLM's own `SamplingMetadata` (and its
min-p processor) and vLLM's own `TopKTopPSampler`, so a seeded request consumes its generator exactly as plain
decoding does: one draw per generated token. An unseeded request with top-p skips the sort of the whole row that
vLLM's top-p makes (`nucleus`) and draws from the same tokens in the same proportions. (The masking compared with is
vLLM's pytorch one, which it runs on CPU: its Triton kernel needs a Triton with a CPU backend, which vLLM's CPU
build does not have.) Requests whose distribution needs anything else (penalties, logit bias,
bad words, allowed tokens, logprobs in a processed logprobs_mode) are not drafted for (eligibility.py).

That walk reads each draw before it knows the next node, which on a GPU is a wait for the stream per visited node.
There (`LogitRows.on_device`) `draw_trees` draws every node of every sampled tree in one call of vLLM's sampler and
reads them back in one copy; the walk then looks its draws up. A seeded request's node at depth d draws from a copy
of its generator in the state plain decoding's d-th draw would find (the states found by letting vLLM's sampler draw
from it), and once the walk is done the generator is left where plain decoding's draws of those tokens leave it: the
same tokens, token for token, as the walk's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vllm_lookahead.backends.staging import download, to_device
from vllm_lookahead.core.tree import StepTree

if TYPE_CHECKING:
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_input_batch import InputBatch

GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: below it a request is greedy
# How many of a row's largest tokens `nucleus` looks among for a top-p nucleus, first and then at most, before it
# falls back to vLLM's sort of the whole row: a chat model's nucleus at top-p 0.9 mostly holds a few tokens.
NUCLEUS_SEARCH = (64, 1024)


def is_greedy(batch: InputBatch, req_index: int) -> bool:
    """Whether a request of the input batch is greedy (read from the batch's host copy of the temperatures)."""
    md = batch.sampling_metadata
    if md.all_greedy:
        return True
    return md.temperature is None or float(batch.temperature_cpu[req_index]) < GREEDY_EPS


def processed_logits(row: torch.Tensor, md: SamplingMetadata, req_index: int) -> torch.Tensor:
    """[vocab] logits -> [1, vocab] float32 after temperature and min-p, as `Sampler.sample` has them before top-k/p."""
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor

    assert md.temperature is not None
    logits = row.to(torch.float32, copy=True).unsqueeze(0)
    logits.div_(md.temperature[req_index : req_index + 1].unsqueeze(1))
    for proc in md.logitsprocs.argmax_invariant:
        if isinstance(proc, MinPLogitsProcessor):
            min_p = proc.get_min_p_by_index(req_index)
            if min_p:  # MinPLogitsProcessor.apply, for this request's min_p
                probs = torch.softmax(logits, dim=-1)
                logits.masked_fill_(probs < probs.amax(dim=-1, keepdim=True) * min_p, -float("inf"))
        else:
            raise RuntimeError(f"lookahead: cannot apply logits processor {type(proc).__name__} on a tree")
    return logits


def nucleus(row: torch.Tensor, k: int | None, p: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The tokens vLLM's top-k / top-p masking keeps (`apply_top_k_top_p`) in a [vocab] float32 row, best first, and
    their logits; found among the row's largest NUCLEUS_SEARCH tokens instead of by sorting the whole row (most of a
    draw's time on a CPU; docs/results.md, "Tuned constants"); None where the nucleus may not lie among them, or
    where the cut falls between tied tokens. k >= 1: top-k (None or >= vocab: none); 0 < p < 1.

    As vLLM keeps them: top-k keeps every token at least as large as the k-th largest; top-p then drops a token
    where it and every token below it hold at most 1 - p of that distribution, that is where the tokens above it
    hold p or more (up to float rounding at that edge: vLLM sums the shares from the bottom of its sorted row)."""
    vocab = row.numel()
    if k is not None and k >= vocab:
        k = None
    assert k is None or k >= 1, k
    looked = 0
    for search in NUCLEUS_SEARCH:
        # k + 1: the token after the k-th tells whether ties with the k-th reach past the tokens looked at
        n = min(vocab, max(search, 0 if k is None else k + 1))
        if n <= looked:
            break  # no wider than the last search
        looked = n
        vals, idx = row.topk(n)
        threshold = None if k is None else vals[k - 1]
        if threshold is not None and threshold > -float("inf"):  # -inf: fewer finite logits than k, top-k masks none
            if n < vocab and vals[-1] >= threshold:
                continue
            in_top_k = int((vals >= threshold).sum())
            vals, idx = vals[:in_top_k], idx[:in_top_k]
            log_total = torch.logsumexp(vals, 0)  # top-p renormalises over the top-k tokens
            whole = True
        else:
            log_total = torch.logsumexp(row, 0)
            whole = n == vocab
        shares = (vals - log_total).exp()
        above = torch.cumsum(shares, 0) - shares  # the share of the tokens ranked above each
        kept = int((above < p).sum())
        if kept == 0:
            return None  # NaN logits (or none finite): vLLM's path decides what they give
        if kept < len(vals) and vals[kept] == vals[kept - 1]:
            return None  # the cut splits tied tokens: which of them vLLM keeps depends on its sort's order of ties
        if kept < len(vals) or whole:
            return idx[:kept], vals[:kept]
    return None


def draw(sampler: Sampler, row: torch.Tensor, md: SamplingMetadata, req_index: int) -> int:
    """The token vLLM's sampler draws from this row of logits for this request (one draw from its generator).

    An unseeded request with top-p draws from its nucleus (`nucleus`) by a Gumbel-max over those tokens alone: the
    distribution vLLM's sampler draws from, without its sort of the whole row. A seeded one takes vLLM's own path,
    so that its generator gives plain decoding's tokens."""
    logits = processed_logits(row, md, req_index)
    k = None if md.top_k is None else md.top_k[req_index : req_index + 1]
    p = None if md.top_p is None else md.top_p[req_index : req_index + 1]
    gen = md.generators.get(req_index)
    if gen is None and p is not None and float(p) < 1.0:
        found = nucleus(logits[0], None if k is None else int(k), float(p))
        if found is not None:
            idx, vals = found
            return int(idx[int(torch.argmax(vals - torch.empty_like(vals).exponential_().log_()))])
    sampled, _ = sampler.topk_topp_sampler(logits, {} if gen is None else {0: gen}, k, p)
    return int(sampled[0])


def draw_at(
    sampler: Sampler, md: SamplingMetadata, req_index: int, rows: torch.Tensor, first: int | None, u: int
) -> int:
    """The target's token at tree node u of a sampled request (`rows`: its tree's logits rows): vLLM's own draw at x0
    when the step sampled it (`first`), else `draw`."""
    if u == 0 and first is not None:
        return first
    return draw(sampler, rows[u], md, req_index)


@dataclass
class TreeDraws:
    """`draw_trees`' draws: per tree, the target's token at every node (node 0: vLLM's own draw at x0 where the step
    sampled it), and per seeded tree its generator with the states it has after 0, 1, 2, ... draws."""

    draws: list[list[int]]
    generators: list[tuple[torch.Generator, list[torch.Tensor]] | None]
    x0_drawn: bool

    def consumed(self, tree: int, tokens: int) -> None:
        """Tree `tree`'s walk output `tokens` tokens: its generator (if seeded) is left as plain decoding's draws of
        them leave it (x0's draw, where vLLM's sampler made it, was consumed already)."""
        seeded = self.generators[tree]
        if seeded is not None:
            generator, states = seeded
            generator.set_state(states[tokens - 1 if self.x0_drawn else tokens])


def draw_trees(
    sampler: Sampler,
    batch: InputBatch,
    logits: torch.Tensor,
    trees: Sequence[tuple[int, int, StepTree]],
    x0: torch.Tensor | None,
) -> TreeDraws:
    """Every node's draw of the step's sampled trees (`trees`: request index, first logits row, tree), each as `draw`
    would make it, in one call of vLLM's sampler and one copy back. x0: vLLM's draw at each request's x0 row (the
    sampler output's first column), or None where the step did not sample them (node 0 is then drawn here too)."""
    md = batch.sampling_metadata
    first = 0 if x0 is None else 1
    rows: list[int] = []
    reqs: list[int] = []
    generators: dict[int, torch.Generator] = {}
    seeded: list[tuple[torch.Generator, list[torch.Tensor]] | None] = []
    for req_index, first_row, tree in trees:
        gen = md.generators.get(req_index)
        states = None if gen is None else _states(sampler, gen, max(tree.depths) + 2 - first, logits)
        seeded.append(None if gen is None or states is None else (gen, states))
        for u in range(first, tree.num_nodes):
            if states is not None:  # the generator as plain decoding's draw at this depth finds it
                copy = torch.Generator(device=gen.device)
                copy.set_state(states[tree.depths[u] - first])
                generators[len(rows)] = copy
            rows.append(first_row + u)
            reqs.append(req_index)
    parts = []
    if rows:
        index = to_device([*rows, *reqs], torch.int64, logits.device).view(2, -1)
        block = _processed_rows(logits, md, index)
        k = None if md.top_k is None else md.top_k.index_select(0, index[1])
        p = None if md.top_p is None else md.top_p.index_select(0, index[1])
        sampled, _ = sampler.topk_topp_sampler(block, generators, k, p)
        parts.append(sampled.view(-1).to(torch.int64))
    if x0 is not None:
        parts.append(x0.reshape(-1).to(torch.int64))
    values = download(torch.cat(parts)) if parts else []
    draws, at = [], 0
    for req_index, _, tree in trees:
        n = tree.num_nodes - first
        draws.append(([values[len(rows) + req_index]] if first else []) + values[at : at + n])
        at += n
    return TreeDraws(draws, seeded, x0 is not None)


def _states(sampler: Sampler, gen: torch.Generator, count: int, logits: torch.Tensor) -> list[torch.Tensor]:
    """The generator's state now and after each of count - 1 draws of vLLM's sampler (a row of the logits' width,
    drawn as a real row is: the draw consumes as much whatever the row holds); the generator is left as it was."""
    states = [gen.get_state()]
    row = torch.zeros(1, logits.shape[-1], dtype=torch.float32, device=logits.device)
    for _ in range(count - 1):
        sampler.topk_topp_sampler(row.clone(), {0: gen}, None, None)
        states.append(gen.get_state())
    gen.set_state(states[0])
    return states


def _processed_rows(logits: torch.Tensor, md: SamplingMetadata, index: torch.Tensor) -> torch.Tensor:
    """The logits rows index[0] of requests index[1], as float32 after temperature and min-p (`processed_logits`, for
    many rows at once)."""
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor

    assert md.temperature is not None
    block = logits.index_select(0, index[0]).to(torch.float32)
    block.div_(md.temperature.index_select(0, index[1]).unsqueeze(1))
    for proc in md.logitsprocs.argmax_invariant:
        if not isinstance(proc, MinPLogitsProcessor):
            raise RuntimeError(f"lookahead: cannot apply logits processor {type(proc).__name__} on a tree")
        if proc.min_p_count:  # MinPLogitsProcessor.apply, each row with its request's min_p (0: keeps every token)
            probs = torch.softmax(block, dim=-1)
            min_p = proc.min_p.view(-1).index_select(0, index[1]).unsqueeze(1)
            block.masked_fill_(probs < probs.amax(dim=-1, keepdim=True) * min_p, -float("inf"))
    return block
