"""The prepared GPU check (`scripts/gpu_check.py`): its logic, run in smoke mode on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gpu_check  # scripts/ is on pytest's pythonpath
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_smoke_run_with_stand_ins_reports_every_measurement(tmp_path):
    """The path the GPU machine takes where datasets, pyarrow, pandas and matplotlib are
    missing: stand-ins, the shared prompt against the per-row path, GDPO with and without the
    shared prompt and MRTPO trained, the replay compared in bf16 and fp32."""
    out = tmp_path / "check.json"
    command = [
        sys.executable,
        str(ROOT / "scripts" / "gpu_check.py"),
        "--smoke",
        "--stand-ins",
        "datasets,pyarrow,pandas,matplotlib",
        "--json",
        str(out),
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    environment.pop("OUT", None)
    subprocess.run(command, check=True, capture_output=True, timeout=240, env=environment)
    report = json.loads(out.read_text())
    assert report["stand_ins"] == ["datasets", "matplotlib", "pandas", "pyarrow"]
    _assert_shared_prompt_part(report["shared_prompt"])
    for run in ("gdpo", "gdpo_per_row", "mrtpo"):
        assert len(report[run]["step_seconds"]) == 3  # 1 warm-up + 2 timed
        assert report[run]["share_prompt"] is (run != "gdpo_per_row")
    assert report["share_prompt_step"]["shared"] is True
    assert report["share_prompt_step"]["time_ratio"] > 0
    assert report["setting"]["mean_prompt_tokens"] > 20
    assert (
        report["mrtpo"]["replayed_rows_share"] > 0 and report["mrtpo"]["median_replay_seconds"] > 0
    )
    assert report["step_time_ratio"] > 0
    precision = report["precision"]
    assert precision["rows"] == 8 and precision["fp32_mean_distance"] > 0
    assert precision["max_abs_difference"] < 0.05 and precision["correlation"] > 0.9


def test_smollm2_tokenizer_ships_with_the_script():
    tokenizer = gpu_check.load_tokenizer(smoke=False)
    assert len(tokenizer) == 49152
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|im_end|>"
    text = "SELECT name FROM singer WHERE age > 30;"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered.endswith("<|im_start|>assistant\n")


def _assert_shared_prompt_part(part):
    exactness = part["exactness"]
    batch = exactness["batch"]
    assert batch["prompt_lengths"] == [20, 13, 6]  # left padding: prompts of three lengths
    assert len(set(batch["completion_lengths"])) > 1
    assert exactness["reference_logp_std"] > 0.01  # real, varying log-probs
    fp32, bf16 = exactness["fp32"], exactness["bf16"]
    assert fp32["logp"]["max_abs"] < 1e-4 and fp32["gradients"]["relative_error"] < 1e-4
    assert fp32["passed"] is True
    per_row_error = bf16["per_row_logp_vs_fp32"]["max_abs"]
    assert 0 < per_row_error < 0.05  # bf16 rounds, and only to bf16's resolution
    assert 0 < bf16["shared_logp_vs_fp32"]["max_abs"] <= 1.5 * per_row_error
    assert 0 < bf16["per_row_repadded_logp"]["max_abs"] < 0.05
    assert 0 < bf16["gradients"]["relative_error"] < 0.05
    assert bf16["passed"] is True
    # The tiny Qwen2's 2 layers, each run again by gradient checkpointing's recomputation.
    assert exactness["kernels_fp32"]["per_row"]["forward"] == {"rows": {"flash (cpu)": 4}}
    assert exactness["kernels_fp32"]["shared"]["forward"] == {
        "prompt": {"flash (cpu)": 4},
        "segments": {"flash (cpu)": 4},
    }
    assert exactness["kernels_fp32"]["shared"]["backward"] == {"flash (cpu)": 4}
    assert part["notes"] == ["no attention falls back to the math kernel"]
    assert set(part["timing"]) == {"tool_task", "large"}
    for timing in part["timing"].values():
        assert timing["batch"]["shared_tokens"] < timing["batch"]["per_row_tokens"]
        for path in ("per_row", "shared"):
            assert len(timing[path]["seconds"]) == 2 and timing[path]["median_seconds"] > 0
        assert timing["time_ratio"] > 0
        assert set(timing["kernels_bf16"]["shared"]["forward"]) == {"prompt", "segments"}
    assert part["timing"]["large"]["batch"]["groups"] == 8


def test_kernel_report_names_a_math_fallback():
    """The profiler-based kernel report: a masked call forced onto the math kernel is named as
    such (with the note the check prints), a causal one keeps the fused CPU kernel, and torch's
    function is restored afterwards."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    original = torch.nn.functional.scaled_dot_product_attention
    query = torch.randn(2, 4, 8, 16, requires_grad=True)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()

    def run():
        sdpa = torch.nn.functional.scaled_dot_product_attention
        with sdpa_kernel([SDPBackend.MATH]):
            masked = sdpa(query, query, query, attn_mask=mask)
        causal = sdpa(query, query, query, is_causal=True)
        (masked.sum() + causal.sum()).backward()

    found = gpu_check.sdpa_kernels(run, {"masked": "segments", "causal": "prompt"})
    assert found["forward"] == {"segments": {"math": 1}, "prompt": {"flash (cpu)": 1}}
    assert found["backward"] == {"flash (cpu)": 1}  # the math call's backward is autograd's
    assert torch.nn.functional.scaled_dot_product_attention is original
    notes = gpu_check.kernel_notes({"shared": found}, "bf16 tool_task")
    assert notes == [
        "bf16 tool_task: the shared attention's segments half falls back to the math kernel "
        "because of its boolean mask ({'math': 1})"
    ]


def test_exactness_check_fails_a_wrong_shared_path(monkeypatch):
    """The exactness criteria can fail: log-probs off by a relative 1e-3 fail in fp32 and bf16."""
    model = gpu_check.shared_prompt_model(smoke=True, device=torch.device("cpu"))
    shared = gpu_check.PATHS["shared"]
    monkeypatch.setitem(gpu_check.PATHS, "shared", lambda m, batch: shared(m, batch) * 1.001)
    report = gpu_check.compare_paths(model, gpu_check.SMOKE_CHECK_SHAPE, vocab_size=512)
    assert report["fp32"]["logp"]["max_abs"] > 1e-3
    assert report["fp32"]["passed"] is False and report["bf16"]["passed"] is False


def test_grouped_batch_pads_as_trl_does():
    shape = gpu_check.Shape("test", groups=2, generations=3, prompt_length=10, completion_length=5)
    prompt_ids, prompt_mask, completion_ids, completion_mask = gpu_check.grouped_batch(
        shape, vocab_size=50, device=torch.device("cpu")
    )
    assert prompt_ids.shape == (6, 10) and completion_ids.shape == (6, 5)
    assert prompt_mask.sum(dim=1).tolist() == [10, 10, 10, 9, 9, 9]  # 10% spread, left-padded
    assert (prompt_mask[:, -1] == 1).all() and (prompt_ids[prompt_mask == 0] == 0).all()
    assert torch.equal(prompt_ids[3], prompt_ids[5]) and not torch.equal(
        prompt_ids[0], prompt_ids[3]
    )
    lengths = completion_mask.sum(dim=1)
    assert lengths.max() == 5 and lengths.min() >= 2
    assert torch.equal(completion_mask, (torch.arange(5) < lengths[:, None]).long())  # right-padded
    assert (completion_ids[completion_mask == 0] == 0).all()


def test_parts_option():
    assert gpu_check.parse_args(["--smoke"]).parts == ["shared_prompt", "training"]
    assert gpu_check.parse_args(["--parts", "training"]).parts == ["training"]
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--parts", "shared_prompt,kernels"])
