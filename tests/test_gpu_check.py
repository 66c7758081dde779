"""The prepared GPU check (`scripts/gpu_check.py`): its logic, run in smoke mode on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gpu_check  # scripts/ is on pytest's pythonpath
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_smoke_run_with_stand_ins_reports_every_measurement(tmp_path):
    """The path the GPU machine takes where datasets, pyarrow, pandas and matplotlib are
    missing: stand-ins, both estimators trained, the replay compared in bf16 and fp32."""
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
    for estimator in ("gdpo", "mrtpo"):
        assert len(report[estimator]["step_seconds"]) == 3  # 1 warm-up + 2 timed
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
