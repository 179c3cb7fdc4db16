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
        from vllm.platforms import current_platform
        from vllm.v1.sample.rejection_sampler import MAX_SPEC_LEN

        if current_platform.is_cpu():  # every platform runs lookahead (trees or chains: glue/platform.py)
            _check_parallelism(self.target_parallel_config)
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
    """Tensor parallelism runs (every rank builds the same trees from the same state); the combinations vLLM 0.32's
    CPU platform cannot run for any speculative method are refused here, before anything starts."""
    if pc is None:
        return
    if pc.pipeline_parallel_size > 1:
        raise ValueError(
            f"lookahead: pipeline_parallel_size must be 1 (got {pc.pipeline_parallel_size}): vLLM 0.32 on CPU runs "
            "no speculative method under pipeline parallelism (its own ngram method fails at start-up the same "
            "way); use tensor_parallel_size"
        )
    if pc.use_ray:
        raise ValueError(
            "lookahead: distributed_executor_backend 'ray' cannot run here: vLLM 0.32's CPU platform does not "
            "support Ray (for any method); use 'mp', the default"
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
        sc = self.speculative_config
        if sc is not None and sc.method == METHOD:
            unsupported.append("lookahead speculative decoding")
        return unsupported

    return _get_v2_model_runner_unsupported_features


PATCHES = [
    Patch("speculative_config.__post_init__", _owner, "__post_init__", _post_init, after=_rebuild_schema),
    Patch(
        "vllm_config._get_v2_model_runner_unsupported_features",
        _v2_owner,
        "_get_v2_model_runner_unsupported_features",
        _v2_unsupported,
    ),
]
