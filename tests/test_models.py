"""The embedded default model: prepared once from its wheel, readable by transformers and by vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_lookahead.devtools import models


def test_prepare_is_idempotent_and_complete(model_path):
    folder = Path(model_path)
    assert folder == models.model_dir(models.DEFAULT_MODEL)
    assert models.is_prepared()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (folder / name).is_file(), name
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_hidden_layers"] == 30 and cfg["vocab_size"] == 49152
    # The top-level rope_theta must be the model's, not the 10000 default.
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] != 10000
    # A second call returns at once without rewriting anything.
    mtime = (folder / "model.safetensors").stat().st_mtime
    assert models.prepare() == folder
    assert (folder / "model.safetensors").stat().st_mtime == mtime


def test_cli_prints_folder_last(model_path, capsys):
    assert models.main(["prepare"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == model_path


def test_unknown_model_is_rejected():
    with pytest.raises(ValueError, match="unknown model"):
        models.prepare("no-such-model")


def test_chat_template_and_tokenizer(model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>assistant" in text
    assert tok.decode(tok.encode("def add(a, b):")).endswith("def add(a, b):")


@pytest.mark.engine
def test_vllm_engine_answers_a_chat(model_path):
    from vllm import SamplingParams

    from tests.conftest import make_llm

    llm = make_llm(model_path, alone=True)
    try:
        out = llm.chat(
            [{"role": "user", "content": "What is the capital of France?"}],
            SamplingParams(temperature=0.0, max_tokens=32),
            use_tqdm=False,
        )
        assert "Paris" in out[0].outputs[0].text
    finally:
        del llm
