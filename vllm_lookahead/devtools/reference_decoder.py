"""Reference lookahead decoder on plain transformers: batch size 1, the oracle for the vLLM path.

One target forward pass per step over the whole step tree (x0, candidates, window) with a 4D
"ancestors only" mask and explicit positions pos(x0) + depth, on the model's own KV cache. After
verification only the root's and the accepted nodes' KV is kept, moved to consecutive positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.core.recycle import TokenRecycler
from vllm_lookahead.core.state import LookaheadState
from vllm_lookahead.core.suffix import SuffixCandidates
from vllm_lookahead.core.tree import StepTree
from vllm_lookahead.core.verify import greedy_verify
from vllm_lookahead.devtools.rejection_sampling import sample_verify


def _tree_mask(tree: StepTree, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive [1, 1, n, prefix_len + n] mask: every node sees the prefix, itself and its ancestors."""
    n = tree.num_nodes
    allowed = torch.ones(n, prefix_len + n, dtype=torch.bool)
    allowed[:, prefix_len:] = tree.ancestor_mask()
    mask = torch.zeros(n, prefix_len + n, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def _keep_kv(cache: Any, prefix_len: int, keep: list[int]) -> None:
    """Keep the cached prefix plus the step's tokens at offsets `keep` (in order); drop the rest."""
    idx = torch.tensor([prefix_len + k for k in keep], dtype=torch.long)
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)
            setattr(layer, name, torch.cat([t[:, :, :prefix_len], t.index_select(2, idx.to(t.device))], dim=2))


@torch.inference_mode()
def lookahead_generate(
    model: Any,
    input_ids: torch.Tensor | Sequence[int],
    max_new_tokens: int,
    params: LookaheadParams | None = None,
    *,
    eos_token_id: int | Sequence[int] | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    max_nodes: int | None = None,
    as_engine: bool = False,
) -> tuple[list[int], dict[str, Any]]:
    """Generate up to `max_new_tokens` tokens after `input_ids` with lookahead decoding (`params`, default
    `LookaheadParams()`; `step_token_budget` does not apply to one sequence, `max_nodes` caps each tree).

    Returns (new_token_ids, stats); stats["steps"] counts target forward passes (the prefill included), so
    stats["compression"] = tokens / steps. Greedy output equals `model.generate(do_sample=False)`.
    `as_engine`: two rules of the engine's drafting (`glue.drafting`) as well: the state is built once the first
    token went out, so the first decoding step carries no tree (the sequence drafts from its third forward), and a
    tree holds no more drafts than the tokens still wanted after x0's (a draft past the last would count for nothing).
    """
    from transformers import DynamicCache

    params = LookaheadParams() if params is None else params
    if max_new_tokens < 1:
        raise ValueError(f"lookahead: max_new_tokens must be >= 1 (got {max_new_tokens})")
    prompt = input_ids.reshape(-1).tolist() if isinstance(input_ids, torch.Tensor) else list(input_ids)
    if eos_token_id is None:
        eos_token_id = getattr(model.generation_config, "eos_token_id", None)
    eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
    device = model.device
    dtype = next(model.parameters()).dtype
    if do_sample and generator is None:
        generator = torch.Generator(device="cpu").manual_seed(params.lookahead_seed)

    def pick(logits: torch.Tensor) -> int:
        if not do_sample:
            return int(logits.argmax())
        probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=generator))

    cache = DynamicCache()
    out = model(input_ids=torch.tensor([prompt], device=device), past_key_values=cache, use_cache=True)
    steps = 1
    new_tokens = [pick(out.logits[0, -1])]
    accepted_total = 0
    # Suffix trees over this sequence only (an engine's also hold earlier requests' outputs).
    suffix = SuffixCandidates.create(params.suffix_depth, 0) if params.suffix_candidates else None
    # Token recycling over this sequence's rows only (an engine's table also holds earlier requests' rows).
    recycle = TokenRecycler() if params.recycle_candidates else None
    state = None if as_engine else LookaheadState(params, prompt, suffix=suffix, recycle=recycle)
    prefix_len = len(prompt)

    while len(new_tokens) < max_new_tokens and new_tokens[-1] not in eos:
        if state is None and len(new_tokens) > 1:  # the engine's rule: built at the request's second step
            state = LookaheadState(params, prompt, suffix=suffix, recycle=recycle)
            seq = prompt + new_tokens
            state.catch_up(len(seq), lambda a, b, seq=seq: seq[a:b])
        x0 = new_tokens[-1]
        cap = max_nodes
        if as_engine:  # the root and the drafts that can still count (`Drafting._room`): none, no tree
            cap = min(max_nodes or max_new_tokens, max_new_tokens - len(new_tokens))
        plain = state is None or (as_engine and cap <= 1)
        tree = StepTree([x0], [-1], [0]) if plain else state.build_tree(x0, max_nodes=cap)
        positions = torch.tensor([[prefix_len + d for d in tree.depths]], device=device)
        mask = _tree_mask(tree, prefix_len, dtype).to(device)
        out = model(
            input_ids=torch.tensor([tree.tokens], device=device),
            position_ids=positions,
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
        )
        steps += 1
        logits = out.logits[0]
        argmax = logits.argmax(dim=-1).tolist()
        if do_sample:
            probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
            accepted_nodes, tokens = sample_verify(tree, probs, generator)
        else:
            accepted_nodes, tokens = greedy_verify(tree, argmax)
        _keep_kv(cache, prefix_len, [0, *accepted_nodes])
        prefix_len += 1 + len(accepted_nodes)
        top = None
        if recycle is not None:  # the target's top tokens at x0 and the accepted nodes: what recycling learns
            top = logits[[0, *accepted_nodes]].topk(recycle.top_k, dim=-1).indices.tolist()
        if state is not None:
            state.update(tree, argmax, tokens, top)
        accepted_total += len(tokens) - 1
        new_tokens.extend(tokens)
    if state is not None:
        state.close()

    # A step may overshoot the length limit or run past EOS: cut as plain decoding would have stopped.
    for i, t in enumerate(new_tokens):
        if t in eos:
            new_tokens = new_tokens[: i + 1]
            break
    new_tokens = new_tokens[:max_new_tokens]
    stats = {
        "steps": steps,
        "tokens": len(new_tokens),
        "accepted": accepted_total,
        "compression": len(new_tokens) / steps,
    }
    return new_tokens, stats
