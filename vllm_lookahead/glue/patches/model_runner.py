"""Model runner: drive lookahead from vLLM's own step (GPUModelRunner, which CPUModelRunner inherits).

Each replacement is a pass-through when the runner has no LookaheadEngine, and otherwise calls one engine method
(engine.py says what each does):
- `__init__`: a lookahead config builds the runner as for a `custom_class` drafter (our LookaheadDrafter, so vLLM
  keeps its list-based draft flow and rejection sampler), then attaches a LookaheadEngine;
- `initialize_kv_cache` -> `confirm_backend` (the attention layers and their caches exist from then on, and vLLM has
  resolved its CUDA graph mode);
- `_update_states` -> `drop_requests`; `_prepare_inputs` -> `begin_step`; `_model_forward` -> `forward_scope`;
  `_sample` -> `sample`; `propose_draft_token_ids` -> `propose`;
- `_input_fits_in_drafter`: always, for lookahead (vLLM would otherwise pad the whole batch with zero drafts
  whenever one request is within num_speculative_tokens of max_model_len);
- `WorkerBase.lookahead_stats` (added): `LLM.collective_rpc("lookahead_stats")` reads the counters.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from vllm_lookahead.glue.engine import LookaheadEngine, worker_stats
from vllm_lookahead.glue.patches.base import Patch
from vllm_lookahead.glue.patches.cpu_sampling import sampling_scope
from vllm_lookahead.glue.patches.speculative_config import METHOD, lookahead_params
from vllm_lookahead.glue.platform import choose_backend
from vllm_lookahead.glue.settings import Settings

DRAFTER_CLASS = "vllm_lookahead.glue.drafter.LookaheadDrafter"


def engine_of(runner: Any) -> LookaheadEngine | None:
    """The runner's LookaheadEngine (None without lookahead): everything the plugin keeps per runner hangs off it."""
    return getattr(runner, "_lookahead", None)


def _owner():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


def _init(original):
    def __init__(self, vllm_config, *args, **kwargs):
        sc = vllm_config.speculative_config
        if sc is None or sc.method != METHOD:
            return original(self, vllm_config, *args, **kwargs)
        settings = Settings.from_env()
        backend = choose_backend(vllm_config, settings)
        # The runner knows no "lookahead" method: let it build a custom-class drafter, then say lookahead again.
        sc.method, sc.model = "custom_class", DRAFTER_CLASS
        try:
            original(self, vllm_config, *args, **kwargs)
        finally:
            sc.method, sc.model = METHOD, METHOD
        self._lookahead = LookaheadEngine(  # the runner's one lookahead attribute (`engine_of`)
            lookahead_params(sc),
            vllm_config.model_config.max_model_len,
            ranks=vllm_config.parallel_config.world_size,
            tokenize=partial(_encode, vllm_config.model_config),
            backend=backend,
            settings=settings,
        )

    return __init__


def _encode(model_config, text: str) -> list[int]:
    """The served model's tokens of a text (the suffix corpus), without special tokens: as the model writes it."""
    from vllm.tokenizers import cached_tokenizer_from_config

    tokenizer = cached_tokenizer_from_config(model_config)
    if tokenizer is None:  # skip_tokenizer_init
        raise ValueError("lookahead: suffix_corpus needs the model's tokenizer (the engine runs without one)")
    return tokenizer.encode(text, add_special_tokens=False)


def _initialize_kv_cache(original):
    def initialize_kv_cache(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        engine = engine_of(self)
        if engine is not None:
            engine.confirm_backend(self)
        return result

    return initialize_kv_cache


def _update_states(original):
    def _update_states(self, scheduler_output):
        engine = engine_of(self)
        if engine is not None:
            engine.drop_requests(self, scheduler_output)
        return original(self, scheduler_output)

    return _update_states


def _prepare_inputs(original):
    def _prepare_inputs(self, scheduler_output, *args, **kwargs):
        result = original(self, scheduler_output, *args, **kwargs)
        engine = engine_of(self)
        if engine is not None:
            engine.begin_step(self, scheduler_output)
        return result

    return _prepare_inputs


def _model_forward(original):
    def _model_forward(self, *args, **kwargs):
        engine = engine_of(self)
        if engine is None:
            return original(self, *args, **kwargs)
        with engine.forward_scope():
            return original(self, *args, **kwargs)

    return _model_forward


def _sample(original):
    def _sample(self, logits, spec_decode_metadata):
        engine = engine_of(self)
        if engine is None:
            return original(self, logits, spec_decode_metadata)
        with sampling_scope():  # vLLM's CPU rejection sampler needs patches/cpu_sampling.py's fix
            return engine.sample(self, original, logits, spec_decode_metadata)

    return _sample


def _propose(original):
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        engine = engine_of(self)
        if engine is None:
            return original(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        return engine.propose(self, sampled_token_ids)

    return propose_draft_token_ids


def _input_fits(original):
    def _input_fits_in_drafter(self, *args, **kwargs):
        # vLLM asks whether its drafter's input fits max_model_len with num_speculative_tokens more, over the
        # whole batch, and where it does not pads every request with num_speculative_tokens zero drafts. Lookahead's
        # drafter runs no model and caps each request's drafts by its own room (`drafting.py`): it always fits.
        if engine_of(self) is not None:
            return True
        return original(self, *args, **kwargs)

    return _input_fits_in_drafter


def _worker_owner():
    from vllm.v1.worker.worker_base import WorkerBase

    return WorkerBase


def _worker_stats(_missing):
    def lookahead_stats(self):
        return worker_stats(engine_of(self.model_runner))

    return lookahead_stats


PATCHES = [
    Patch("worker.lookahead_stats (added)", _worker_owner, "lookahead_stats", _worker_stats),
    Patch("runner.__init__", _owner, "__init__", _init),
    Patch("runner.initialize_kv_cache", _owner, "initialize_kv_cache", _initialize_kv_cache),
    Patch("runner._update_states", _owner, "_update_states", _update_states),
    Patch("runner._prepare_inputs", _owner, "_prepare_inputs", _prepare_inputs),
    Patch("runner._model_forward", _owner, "_model_forward", _model_forward),
    Patch("runner._sample", _owner, "_sample", _sample),
    Patch("runner.propose_draft_token_ids", _owner, "propose_draft_token_ids", _propose),
    Patch("runner._input_fits_in_drafter", _owner, "_input_fits_in_drafter", _input_fits),
]
