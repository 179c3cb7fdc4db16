"""CLI: `--speculative-model "[lookahead]"`, shorthand for `--speculative-config '{"method": "lookahead"}'`.

vLLM 0.32 has no `--speculative-model` flag (its own spelling is `--spec-model`); this adds it as another
spelling of `--spec-model`, whose value `[lookahead]` selects the method (patches/speculative_config.py).

A `--speculative-config` that is JSON but not an object (`[1]`, `"lookahead"`, `3`) makes vLLM 0.32 fail with
`AttributeError: 'list' object has no attribute 'items'` for any method; it is refused with a message naming the
flag instead. Every other value passes through unchanged.
"""

from __future__ import annotations

from vllm_lookahead.glue.patches.base import Patch


def _owner():
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs


def _add_cli_args(original):
    func = original.__func__ if isinstance(original, staticmethod) else original

    def add_cli_args(parser, *args, **kwargs):
        parser = func(parser, *args, **kwargs)
        if not any("--speculative-model" in a.option_strings for a in parser._actions):
            parser.add_argument(
                "--speculative-model",
                dest="spec_model",
                default=None,
                help='Same as --spec-model. "[lookahead]" turns on lookahead decoding (vllm-lookahead plugin).',
            )
        return parser

    return staticmethod(add_cli_args)


def _create_speculative_config(original):
    def create_speculative_config(self, *args, **kwargs):
        sc = self.speculative_config
        if sc is not None and not isinstance(sc, dict):
            raise ValueError(
                f"speculative_config (--speculative-config) must be a JSON object of keys such as "
                f'{{"method": "lookahead"}} (got {type(sc).__name__} {sc!r})'
            )
        return original(self, *args, **kwargs)

    return create_speculative_config


PATCHES = [
    Patch("engine_args.add_cli_args", _owner, "add_cli_args", _add_cli_args),
    Patch("engine_args.create_speculative_config", _owner, "create_speculative_config", _create_speculative_config),
]
