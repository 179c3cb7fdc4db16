"""SpeculativeConfig: accept `method: "lookahead"` and its keys, and derive num_speculative_tokens.

vLLM's SpeculativeConfig is a pydantic dataclass with a fixed `method` Literal that forbids unknown keys.
The patch widens the Literal, adds the lookahead keys as optional fields (so pydantic still rejects any
other key, naming it), and wraps `__post_init__` to validate them with `LookaheadParams` and to set what a
model-less method needs. `[lookahead]` as the model (`--spec-model "[lookahead]"`) selects the method.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Optional

from vllm_lookahead.core.params import LookaheadParams
from vllm_lookahead.glue.patches.base import Patch

METHOD = "lookahead"
# The speculative_config keys are LookaheadParams' fields, nothing else.
KEYS = LookaheadParams.keys()
_KEY_TYPES: dict[str, Any] = {k: Optional[Any] for k in KEYS}  # noqa: UP045 - pydantic needs a runtime type
SHORTHANDS = ("lookahead", "[lookahead]")


def _owner():
    from vllm.config.speculative import SpeculativeConfig

    return SpeculativeConfig


def lookahead_params(cfg: Any) -> LookaheadParams:
    """The validated LookaheadParams of a (patched) SpeculativeConfig; a key left unset or null takes its default."""
    return LookaheadParams.from_mapping({k: getattr(cfg, k, None) for k in KEYS})


def _post_init(original):
    def __post_init__(self) -> None:
        if self.method is None and self.model in SHORTHANDS:
            self.method = METHOD
        if self.method != METHOD:
            stray = [k for k in KEYS if getattr(self, k, None) is not None]
            if stray:
                raise ValueError(
                    f"speculative_config: {', '.join(stray)} only apply to method 'lookahead' "
                    f"(method is {self.method!r})"
                )
            return original(self)
        from vllm.v1.sample.rejection_sampler import MAX_SPEC_LEN

        _check_parallelism(self.target_parallel_config)
        _check_model(self.target_model_config)
        params = lookahead_params(self)  # ValueError naming the field and its range
        needed = params.max_tree_nodes - 1  # every node but the root x0 is a draft token
        shape = (
            f"window_size={params.window_size}, ngram_size={params.ngram_size}, "
            f"guess_set_size={params.guess_set_size}, lookup_candidates={params.lookup_candidates}, "
            f"lookup_len={params.lookup_len}"
        )
        if needed > MAX_SPEC_LEN:
            raise ValueError(
                f"lookahead: the step tree of {shape} has {needed} draft tokens, more than vLLM's limit of "
                f"{MAX_SPEC_LEN} per step; lower some of them"
            )
        if self.num_speculative_tokens is None:
            self.num_speculative_tokens = needed
        elif not needed <= self.num_speculative_tokens <= MAX_SPEC_LEN:
            raise ValueError(
                f"lookahead: num_speculative_tokens must be in [{needed}, {MAX_SPEC_LEN}] for the step tree of "
                f"{shape} (got {self.num_speculative_tokens}); leave it unset to derive it"
            )
        self.model = METHOD
        self.prompt_lookup_max = 0
        self.prompt_lookup_min = 0
        self.draft_model_config = self.target_model_config
        self.draft_parallel_config = self.target_parallel_config

    __post_init__.__wrapped__ = original
    return __post_init__


def _check_parallelism(pc: Any) -> None:
    """Tensor parallelism runs (every rank builds the same trees from the same state). Pipeline parallelism is
    refused on every platform: only the last stage samples, so the earlier stages never propose a tree and would
    run the drafts at linear positions while the last stage runs them as trees (and vLLM 0.32 on CPU runs no
    speculative method under it). Ray is refused where vLLM's platform has none (CPU)."""
    from vllm.platforms import current_platform

    if pc is None:
        return
    if pc.pipeline_parallel_size > 1:
        raise ValueError(
            f"lookahead: pipeline_parallel_size must be 1 (got {pc.pipeline_parallel_size}): only the last pipeline "
            "stage samples and verifies, and the others would compute the trees' rows at other positions; use "
            "tensor_parallel_size"
        )
    if pc.use_ray and current_platform.is_cpu():
        raise ValueError(
            "lookahead: distributed_executor_backend 'ray' cannot run here: vLLM 0.32's CPU platform does not "
            "support Ray (for any method); use 'mp', the default"
        )


def _check_model(mc: Any) -> None:
    """Models with recurrent layers (Mamba, linear attention, gated delta nets: vLLM's hybrid and attention-free
    models) are refused: those layers would read a step's tree rows as one sequence, and nothing here restores their
    state to the accepted path. (`platform.check_model_layers` refuses them again on the loaded layers.)"""
    if mc is None:
        return
    if mc.is_hybrid or mc.is_attention_free:
        kind = "hybrid" if mc.is_hybrid else "attention-free"
        raise ValueError(
            f"lookahead: {', '.join(mc.architectures or ['the model'])} is a {kind} model (recurrent layers such as "
            "Mamba, linear attention or gated delta nets): lookahead drafts only for models whose every layer is "
            "attention"
        )


def _rebuild_schema(cls) -> None:
    """Widen (patched) or restore (reverted) the pydantic schema to match `__post_init__`."""
    import vllm.config.speculative as sp
    from pydantic.dataclasses import rebuild_dataclass
    from pydantic.fields import FieldInfo

    patched = hasattr(cls.__dict__["__post_init__"], "__wrapped__")
    method_t = Optional[Literal[sp.SpeculativeMethod, METHOD]] if patched else Optional[sp.SpeculativeMethod]  # noqa: UP045
    for store in (cls.__annotations__,):
        store["method"] = method_t
    cls.__dataclass_fields__["method"].type = method_t
    cls.__pydantic_fields__["method"] = FieldInfo.from_annotated_attribute(method_t, None)
    for name, typ in _KEY_TYPES.items():
        if patched:
            f = dataclasses.field(default=None)
            f.name, f.type = name, typ
            f._field_type = dataclasses._FIELD  # type: ignore[attr-defined]
            cls.__dataclass_fields__[name] = f
            cls.__annotations__[name] = typ
            cls.__pydantic_fields__[name] = FieldInfo.from_annotated_attribute(typ, None)
            setattr(cls, name, None)
        else:
            for store in (cls.__dataclass_fields__, cls.__annotations__, cls.__pydantic_fields__):
                store.pop(name, None)
            if name in cls.__dict__:
                delattr(cls, name)
    rebuild_dataclass(cls, force=True, _types_namespace=vars(sp))


def _v2_owner():
    from vllm.config.vllm import VllmConfig

    return VllmConfig


def _v2_unsupported(original):
    # The V2 model runner (picked where Triton works) has none of the runner patches: stay on V1.
    def _get_v2_model_runner_unsupported_features(self) -> list[str]:
        unsupported = original(self)
        if _lookahead(self):
            unsupported.append("lookahead speculative decoding")
        return unsupported

    return _get_v2_model_runner_unsupported_features


def _v2_required(original):
    # vLLM takes the V2 runner without asking which features it lacks where VLLM_USE_V2_MODEL_RUNNER=1, or where
    # watermarking or HiSparse need it: none of lookahead's runner hooks would run there, so refuse at start-up.
    def use_v2_model_runner(self) -> bool:
        v2 = original.fget(self)
        if v2 and _lookahead(self):
            raise ValueError(
                "lookahead: runs on vLLM's V1 model runner only, and this engine would take Model Runner V2 "
                "(VLLM_USE_V2_MODEL_RUNNER=1, or watermarking / HiSparse, which need it); unset "
                "VLLM_USE_V2_MODEL_RUNNER or leave those features off"
            )
        return v2

    return property(use_v2_model_runner)


def _lookahead(vllm_config: Any) -> bool:
    sc = vllm_config.speculative_config
    return sc is not None and sc.method == METHOD


PATCHES = [
    Patch("speculative_config.__post_init__", _owner, "__post_init__", _post_init, after=_rebuild_schema),
    Patch(
        "vllm_config._get_v2_model_runner_unsupported_features",
        _v2_owner,
        "_get_v2_model_runner_unsupported_features",
        _v2_unsupported,
    ),
    Patch("vllm_config.use_v2_model_runner", _v2_owner, "use_v2_model_runner", _v2_required),
]
