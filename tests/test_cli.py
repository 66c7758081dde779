"""The `mrtpo` command: eval writes its table and JSON, train runs and resumes, bad input exits 2.

A small in-test task (`echo`) keeps these fast and independent of the bundled tasks' data; the
bundled tasks run through the same commands in the integration tests at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from datasets import Dataset

from mrtpo import cli, tasks
from mrtpo.tasks.base import Task
from mrtpo.testing import tiny_model_and_tokenizer
from mrtpo.verifiers import Verdict, Verifier

ROOT = Path(__file__).resolve().parents[1]


class HasAnswerTag(Verifier):
    name = "answer_tag"

    def verify(self, completion, example):
        return Verdict(float("<answer>" in completion), "format: <answer>...</answer>")


class MentionsNumber(Verifier):
    """Not applicable (None) on odd rows, to check means skip them."""

    name = "mentions_number"

    def verify(self, completion, example):
        if example["number"] % 2:
            return Verdict(None, "")
        return Verdict(float(str(example["number"]) in completion), f"number: {example['number']}")


class EchoTask(Task):
    name = "echo"
    system_prompt = "Repeat the number inside <answer> tags."

    def load(self, split="train", path=None, **kwargs):
        if path is not None:
            rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
        else:
            rows = [{"number": n} for n in range(10 if split == "train" else 6)]
        return Dataset.from_list(
            [
                {
                    "prompt": [
                        {"role": "system", "content": self.system_prompt},
                        {"role": "user", "content": f"The number is {row['number']}."},
                    ],
                    "number": row["number"],
                }
                for row in rows
            ]
        )

    def verifiers(self, **kwargs):
        return [HasAnswerTag(), MentionsNumber()]

    def reference_completion(self, example):
        return f"<answer>{example['number']}</answer>"


@pytest.fixture
def echo_task(monkeypatch):
    task = EchoTask()
    real_get = tasks.get
    monkeypatch.setattr(tasks, "get", lambda name: task if name == "echo" else real_get(name))
    return task


def run_cli(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ----------------------------------------------------------------------------- eval


def test_eval_writes_table_and_json(echo_task, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    code, stdout, _ = run_cli(
        [
            "eval",
            "--task",
            "echo",
            "--model_name_or_path",
            str(tiny_model_dir),
            "--max_examples",
            "5",
            "--max_new_tokens",
            "6",
            "--batch_size",
            "2",
            "--output_dir",
            str(out),
        ],
        capsys,
    )
    assert code == 0
    report = json.loads((out / "eval.json").read_text())
    assert report["num_examples"] == 5 and len(report["examples"]) == 5
    example = report["examples"][0]
    assert example["prompt"][0]["content"] == EchoTask.system_prompt
    assert set(example["verdicts"]) == {"answer_tag", "mentions_number"}
    assert 1 <= example["completion_tokens"] <= 6
    # Means are over applicable rows only: rows 0, 2, 4 for mentions_number.
    scores = [e["verdicts"]["mentions_number"]["score"] for e in report["examples"]]
    assert scores[1] is None and scores[3] is None
    assert report["verifiers"]["mentions_number"] == pytest.approx(sum(scores[::2]) / 3)
    tags = [e["verdicts"]["answer_tag"]["score"] for e in report["examples"]]
    assert report["verifiers"]["answer_tag"] == pytest.approx(sum(tags) / 5)
    assert set(report["headline"]) == {"accuracy"}
    for name in ("answer_tag", "mentions_number", "accuracy"):
        assert name in stdout


def test_eval_batching_does_not_change_greedy_completions(
    echo_task, tiny_model_dir, tmp_path, capsys
):
    """Left padding is handled: batch size 1 and 4 give the same greedy text."""
    completions = []
    for batch_size in (1, 4):
        out = tmp_path / f"b{batch_size}"
        code, _, _ = run_cli(
            [
                "eval",
                "--task",
                "echo",
                "--model_name_or_path",
                str(tiny_model_dir),
                "--max_examples",
                "4",
                "--max_new_tokens",
                "5",
                "--batch_size",
                str(batch_size),
                "--output_dir",
                str(out),
            ],
            capsys,
        )
        assert code == 0
        completions.append(
            [e["completion"] for e in json.loads((out / "eval.json").read_text())["examples"]]
        )
    assert completions[0] == completions[1]


def test_eval_sampling_gives_num_samples_per_prompt_seeded(
    echo_task, tiny_model_dir, tmp_path, capsys
):
    """--temperature/--num_samples: each prompt's samples together, the same for the same seed,
    and not all equal to the greedy completion."""
    reports = {}
    for name, flags in [
        ("greedy", []),
        ("a", ["--temperature", "1.0", "--num_samples", "3"]),
        ("b", ["--temperature", "1.0", "--num_samples", "3"]),
        ("seed1", ["--temperature", "1.0", "--num_samples", "3", "--seed", "1"]),
    ]:
        out = tmp_path / name
        argv = ["eval", "--task", "echo", "--model_name_or_path", str(tiny_model_dir),
                "--max_examples", "2", "--max_new_tokens", "8", "--batch_size", "4",
                "--output_dir", str(out), *flags]  # fmt: skip
        code, stdout, _ = run_cli(argv, capsys)
        assert code == 0
        reports[name] = json.loads((out / "eval.json").read_text())
    sampled = reports["a"]["examples"]
    assert len(sampled) == 6 and reports["a"]["decoding"] == "3 samples per prompt at temperature 1"
    assert [e["prompt"][1]["content"] for e in sampled] == ["The number is 0."] * 3 + [
        "The number is 1."
    ] * 3
    # The echo task's "number" column travels with each sample: odd rows are not applicable.
    assert [e["verdicts"]["mentions_number"]["score"] is None for e in sampled] == [False] * 3 + [
        True
    ] * 3
    texts = [e["completion"] for e in sampled]
    assert texts == [e["completion"] for e in reports["b"]["examples"]]
    assert texts != [e["completion"] for e in reports["seed1"]["examples"]]
    greedy = [e["completion"] for e in reports["greedy"]["examples"]]
    assert reports["greedy"]["decoding"] == "greedy" and len(greedy) == 2
    assert set(texts) != {greedy[0], greedy[1]}
    code, _, err = run_cli(
        ["eval", "--task", "echo", "--model_name_or_path", str(tiny_model_dir),
         "--num_samples", "2", "--output_dir", str(tmp_path / "bad")],
        capsys,
    )  # fmt: skip
    assert code == 2 and "num_samples" in err


def test_eval_prompt_ids_equal_trl_grpo_rendering(echo_task):
    """`mrtpo eval` tokenizes prompts exactly as TRL's GRPOTrainer does before generating."""
    from mrtpo.generation import render_prompt_ids
    from mrtpo.testing import tiny_model_and_tokenizer
    from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

    # A model of its own: the trainer's accelerate wrapping rebinds `forward`, which would leak
    # into the session-wide `tiny` fixture (a deepcopy of it would still call the original).
    model, tokenizer = tiny_model_and_tokenizer()
    dataset = echo_task.load("test")
    trainer = MRTPOTrainer(
        model=model,
        reward_funcs=echo_task.verifiers(),
        args=MRTPOConfig(
            output_dir="unused",
            num_generations=2,
            per_device_train_batch_size=2,
            bf16=False,
            activation_checkpointing=False,
            report_to="none",
        ),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trl_ids, _, _ = trainer._tokenize_prompts(list(dataset["prompt"]))
    assert render_prompt_ids(tokenizer, list(dataset["prompt"])) == [list(ids) for ids in trl_ids]


# ----------------------------------------------------------------------------- train


def train_argv(model_dir, output_dir, *extra):
    return [
        "train",
        "--task",
        "echo",
        "--model_name_or_path",
        str(model_dir),
        "--output_dir",
        str(output_dir),
        "--max_completion_length",
        "6",
        "--num_generations",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--save_steps",
        "1",
        *extra,
    ]


def test_train_two_steps_then_resume(echo_task, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, _ = run_cli(
        train_argv(tiny_model_dir, out, "--advantage_estimator", "gdpo", "--max_steps", "2"), capsys
    )
    assert code == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2]
    assert (out / "curves.png").is_file() and (out / "checkpoint-2").is_dir()
    assert (out / "model.safetensors").is_file()  # the final model folder eval takes
    # One summary line per step.
    summaries = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in summaries] == ["step 1/2", "step 2/2"]
    assert "answer_tag" in summaries[0] and "mentions_number" in summaries[0]

    code, _, _ = run_cli(
        train_argv(
            tiny_model_dir,
            out,
            "--advantage_estimator",
            "gdpo",
            "--max_steps",
            "3",
            "--resume_from_checkpoint",
            "last",
        ),
        capsys,
    )
    assert code == 0
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]


def test_train_default_output_dir_and_config(echo_task, tmp_path, monkeypatch):
    from mrtpo.commands.train import parse_args
    from mrtpo.training import CPU_DEFAULTS

    monkeypatch.chdir(tmp_path)
    script_args, _, config = parse_args(["--task", "echo", "--advantage_estimator", "gdpo"])
    assert config.output_dir == "outputs/echo-gdpo"
    assert config.max_steps == CPU_DEFAULTS["max_steps"]
    assert config.num_generations == CPU_DEFAULTS["num_generations"]
    assert config.advantage_estimator == "gdpo" and script_args.task == "echo"
    assert config.mrtpo_beta == 0.0 and not config.beta_is_auto  # the default auto: GDPO's 0
    assert parse_args(["--task", "echo"])[2].beta_is_auto  # MRTPO: beta from its gradients

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump({"task": "echo", "mrtpo_beta": 0.25, "max_steps": 7, "sft_max_steps": 3})
    )
    script_args, cold_start, config = parse_args(["--config", str(recipe), "--max_steps", "9"])
    assert (config.mrtpo_beta, config.max_steps, cold_start.sft_max_steps) == (0.25, 9, 3)


# ----------------------------------------------------------------------------- bad input


def assert_one_error_line(code, err, *needles):
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0]


def test_unknown_task_exits_2(capsys, tmp_path):
    code, _, err = run_cli(["train", "--task", "chess", "--output_dir", str(tmp_path)], capsys)
    assert_one_error_line(code, err, "mrtpo train: error:", "chess")
    code, _, err = run_cli(["eval", "--task", "chess", "--output_dir", str(tmp_path)], capsys)
    assert_one_error_line(code, err, "mrtpo eval: error:", "chess")


def test_missing_data_path_exits_2(echo_task, tiny_model_dir, tmp_path, capsys):
    missing = str(tmp_path / "no_such.jsonl")
    code, _, err = run_cli(train_argv(tiny_model_dir, tmp_path / "o", "--data", missing), capsys)
    assert_one_error_line(code, err, missing)
    code, _, err = run_cli(
        ["eval", "--task", "echo", "--model_name_or_path", str(tiny_model_dir), "--data", missing],
        capsys,
    )
    assert_one_error_line(code, err, missing)


def test_model_path_without_weights_exits_2(echo_task, tiny, tmp_path, capsys):
    empty = tmp_path / "no-weights"
    tiny[1].save_pretrained(empty)
    code, _, err = run_cli(train_argv(empty, tmp_path / "o"), capsys)
    assert_one_error_line(code, err, str(empty), "no model weights")
    code, _, err = run_cli(["eval", "--task", "echo", "--model_name_or_path", str(empty)], capsys)
    assert_one_error_line(code, err, str(empty))


def test_reward_weights_not_matching_verifiers_exits_2(echo_task, tiny_model_dir, tmp_path, capsys):
    code, _, err = run_cli(
        train_argv(tiny_model_dir, tmp_path / "o", "--reward_weights", "1.0", "2.0", "3.0"), capsys
    )
    assert_one_error_line(code, err, "reward_weights has 3 values", "2 verifiers")


def test_bad_config_value_exits_2(echo_task, tmp_path, capsys):
    code, _, err = run_cli(
        ["train", "--task", "echo", "--mrtpo_beta", "1.5", "--output_dir", str(tmp_path)], capsys
    )
    assert_one_error_line(code, err, "mrtpo_beta")


def test_console_script_prints_one_line_and_exits_2(tmp_path):
    """The installed `mrtpo` entry point, in a fresh process: no traceback reaches the user."""
    mrtpo = Path(sys.executable).parent / "mrtpo"
    result = subprocess.run(
        [str(mrtpo), "eval", "--task", "chess", "--output_dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "mrtpo eval: error: unknown task 'chess'; choose one of sql, tool_calling, instructions"
    ]


# ----------------------------------------------------------------------------- recipes

RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def test_recipes_exist_for_every_task_on_cpu_and_gpu():
    names = {path.stem for path in RECIPES}
    assert {"sql", "tool_calling", "instructions"} <= names
    gpu_models = {
        yaml.safe_load(p.read_text())["model_name_or_path"]
        for p in RECIPES
        if p.stem.endswith("-gpu")
    }
    assert gpu_models == {
        "Qwen/Qwen2.5-Coder-3B-Instruct", "Qwen/Qwen2.5-Coder-7B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct",
        "Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen3-4B-Instruct-2507",
    }  # fmt: skip


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_parses_with_mrtpo_train(recipe):
    """Every key of every recipe reaches the parsed arguments unchanged. GPU recipes are parsed
    with bf16 and vLLM switched off by flags (this machine has neither)."""
    from mrtpo.commands.train import parse_args

    values = yaml.safe_load(recipe.read_text())
    gpu = recipe.stem.endswith("-gpu")
    overrides = ["--bf16", "false", "--use_vllm", "false"] if gpu else []
    parsed = parse_args(["--config", str(recipe), *overrides])
    merged = {}
    for part in parsed:
        merged.update(vars(part))
    for key, value in values.items():
        if gpu and key in {"bf16", "use_vllm"}:
            continue
        if key == "report_to":  # TrainingArguments turns "none" into an empty list
            assert value == "none" and merged[key] == []
            continue
        assert merged[key] == value, key
    if gpu:
        assert (values["use_vllm"], values["vllm_mode"], values["bf16"]) == (True, "colocate", True)
        assert (values["mrtpo_beta"], values["mrtpo_warmup_steps"]) == ("auto", 10)
        assert (values["adam_beta1"], values["adam_beta2"]) == (0.9, 0.999)


SAW_LINE = "# reward_weighting: saw"


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_gains_saw_by_uncommenting_one_line(recipe, tmp_path):
    from mrtpo.commands.train import parse_args

    text = recipe.read_text()
    assert text.count(SAW_LINE) == 1
    plus_saw = tmp_path / recipe.name
    plus_saw.write_text(text.replace(SAW_LINE, SAW_LINE[2:]))
    overrides = ["--bf16", "false", "--use_vllm", "false"] if recipe.stem.endswith("-gpu") else []
    config = parse_args(["--config", str(plus_saw), *overrides])[-1]
    assert config.reward_weighting == "saw"
    assert parse_args(["--config", str(recipe), *overrides])[-1].reward_weighting == "static"


def test_demo_cold_start_is_the_recipes_budget():
    from mrtpo.commands.demo import COLD_START

    recipe = yaml.safe_load((ROOT / "recipes" / "tool_calling.yaml").read_text())
    assert {key: recipe[f"sft_{key}"] for key in COLD_START} == COLD_START


# ----------------------------------------------------------------------------- bundled tasks


@pytest.mark.parametrize("task_name", ["sql", "tool_calling", "instructions"])
def test_eval_on_bundled_task(task_name, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / task_name
    code, stdout, _ = run_cli(
        ["eval", "--task", task_name, "--model_name_or_path", str(tiny_model_dir), "--max_examples", "2",
         "--max_new_tokens", "4", "--output_dir", str(out)],
        capsys,
    )  # fmt: skip
    assert code == 0
    task = tasks.get(task_name)
    report = json.loads((out / "eval.json").read_text())
    names = [verifier.name for verifier in task.verifiers()]
    assert list(report["verifiers"]) == names
    assert task.headline_name in report["headline"]
    assert all(list(e["verdicts"]) == names for e in report["examples"])
    assert report["examples"][0]["prompt"] == task.load("test")[0]["prompt"]
    assert task.headline_name in stdout


def test_train_mrtpo_two_steps_on_tool_calling(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "tools"
    code, stdout, _ = run_cli(
        ["train", "--task", "tool_calling", "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out),
         "--max_steps", "2", "--max_completion_length", "6", "--num_generations", "2",
         "--per_device_train_batch_size", "4", "--max_train_examples", "8", "--mrtpo_warmup_steps", "0",
         "--mrtpo_beta", "0.5"],
        capsys,
    )  # fmt: skip
    assert code == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["mrtpo/beta"] == 0.5 for r in steps)  # no warm-up: full beta from step 1
    assert all(
        "rewards/tool_format/mean" in r and "rewards/tool_correctness/mean" in r for r in steps
    )
    summaries = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert len(summaries) == 2 and "beta 0.50" in summaries[0] and "replay" in summaries[0]


# ----------------------------------------------------------------------------- demo


def test_replay_demo_prints_every_token_with_three_distances(tiny_model_dir, capsys):
    from mrtpo.commands import demo

    code, stdout, _ = run_cli(
        ["demo", "--replay-only", "--model_name_or_path", str(tiny_model_dir)], capsys
    )
    assert code == 0
    assert "sql_format = 1.0" in stdout and "sql_executable = 1.0" in stdout
    assert "sql_execution = 0.0" in stdout  # `>=` also returns the singer aged exactly 30
    rows = [line for line in stdout.splitlines() if line.startswith("│")]
    _, tokenizer = tiny_model_and_tokenizer(seed=0)
    n_tokens = len(tokenizer(demo.RESPONSE, add_special_tokens=False)["input_ids"]) + 1  # + eos
    assert len(rows) == n_tokens
    distances = [[float(cell) for cell in row.split("│")[3:6]] for row in rows]
    assert all(0.0 <= d <= 1.0 for row in distances for d in row)
    assert any(d > 0 for row in distances for d in row)


def test_training_demo_runs_every_step_on_tiny_model(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "demo"
    code, stdout, _ = run_cli(
        ["demo", "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out), "--eval_examples", "2",
         "--max_steps", "1", "--sft_max_steps", "1", "--with_base"],
        capsys,
    )  # fmt: skip
    assert code == 0
    for folder in ("eval-base", "eval-before", "eval-after"):
        report = json.loads((out / folder / "eval.json").read_text())
        # 2 prompts x 2 samples at the training temperature.
        assert report["num_examples"] == 2 and len(report["examples"]) == 4
        assert report["decoding"] == "2 samples per prompt at temperature 1"
    assert (out / "sft" / "model.safetensors").is_file()
    assert (out / "train" / "curves.png").is_file()
    results = (out / "results.md").read_text()
    assert "| tool_format |" in results and "after (MRTPO)" in results and "| total |" in results
    assert f"reward curves: {out / 'train' / 'curves.png'}" in stdout
    assert (out / "credit" / "credit.html").is_file()
    assert f"credit map: {out / 'credit' / 'credit.html'}" in stdout
    assert "| credit map of a trained response |" in results


def test_demo_ends_with_the_credit_map_of_a_trained_response(tiny_model_dir, tmp_path, capsys):
    """The last stage: `mrtpo explain` of the model's answer to a test prompt, on the terminal
    (one line per reward, then the token row) and in credit.html, with the command to open it."""
    from mrtpo.commands import demo

    timings = {}
    out = tmp_path / "credit"
    page = demo.show_credit_map(str(tiny_model_dir), out, max_new_tokens=8, timings=timings)
    stdout = capsys.readouterr().out
    assert page == out / "credit.html" and page.is_file()
    assert list(timings) == ["credit map of a trained response"]
    assert "mrtpo explain --task tool_calling" in stdout
    text = page.read_text(encoding="utf-8")
    assert text.count('<tr class="row reward">') == 2  # tool_format and tool_correctness
    assert text.count('<tr class="row combined">') == 1  # a group: MRTPO's token advantages
    for reward in ("tool_format", "tool_correctness"):
        assert f"{reward}: score" in stdout  # the terminal map's row heading
    assert "MRTPO (combined): token mean" in stdout
    assert f"-m webbrowser {page.resolve().as_uri()}" in stdout
