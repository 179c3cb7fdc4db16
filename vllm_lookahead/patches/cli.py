"""CLI: `--speculative-model "[lookahead]"`, shorthand for `--speculative-config '{"method": "lookahead"}'`.

vLLM 0.32 has no `--speculative-model` flag (its own spelling is `--spec-model`); this adds it as another
spelling of `--spec-model`, whose value `[lookahead]` selects the method (patches/speculative_config.py).
"""

from __future__ import annotations

from vllm_lookahead.patches.base import Patch


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


PATCHES = [Patch("engine_args.add_cli_args", _owner, "add_cli_args", _add_cli_args)]
