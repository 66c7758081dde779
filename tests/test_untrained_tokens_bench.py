"""`benchmarks/untrained_tokens.py`: the reference tokens a model never trained, their twin rows,
and where the test references write them (log p, rank), on a tiny model given such a row."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from mrtpo import tasks
from mrtpo.cold_start import cold_start_dataset
from mrtpo.generation import render_prompt_ids
from mrtpo.testing import tiny_model, tiny_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import untrained_tokens  # noqa: E402


def test_untrained_reference_tokens_their_twins_and_log_p(tmp_path, one_torch_thread):
    tokenizer = tiny_tokenizer()
    model = tiny_model(len(tokenizer), tied=False)
    task = tasks.get("tool_calling")
    first_test = cold_start_dataset(task, "test", max_examples=1, seed=0)[0]
    completion = tokenizer(first_test["completion"][0]["content"], add_special_tokens=False)
    token_id = completion["input_ids"][0]
    twin = next(i for i in range(len(tokenizer) - 1, 0, -1) if i != token_id)
    with torch.no_grad():  # as released: both rows shared with a never-used token
        model.get_input_embeddings().weight[token_id] = model.get_input_embeddings().weight[twin]
        model.get_output_embeddings().weight[token_id] = model.get_output_embeddings().weight[twin]
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")

    out = tmp_path / "out"
    argv = ["--model", str(tmp_path / "model"), "--references", "8", "--rows", "1", "--out", str(out)]  # fmt: skip
    assert untrained_tokens.main(argv) == 0

    result = json.loads((out / "untrained_tokens.json").read_text())
    assert token_id in result["untrained"]
    rows = result["rows"][str(token_id)]
    assert twin in rows["input"]["twins"] and twin in rows["output"]["twins"]
    norm = float(model.get_output_embeddings().weight[twin].norm())
    assert abs(rows["output"]["norm"] - norm) < 1e-5
    first = [p for p in result["where_written"][str(tmp_path / "model")] if p["position"] == 0]
    assert first and first[0]["token_id"] == token_id and first[0]["row"] == 0
    # The same log p and rank computed here, at the prompt's last position.
    prompt = render_prompt_ids(tokenizer, [first_test["prompt"]])[0]
    with torch.no_grad():
        log_p = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1], dim=-1)
    assert abs(first[0]["log_p"] - float(log_p[token_id])) < 1e-4
    assert first[0]["rank"] == int((log_p > log_p[token_id]).sum()) + 1
    assert abs(first[0]["top"][0][1] - float(log_p.max())) < 1e-4
    text = (out / "untrained_tokens.md").read_text()
    assert f"| {token_id} | output |" in text and str(twin) in text
