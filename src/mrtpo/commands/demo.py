"""`mrtpo demo` (what `make demo` runs): a cold start, then MRTPO, on the embedded model.

The embedded SmolLM2-135M-Instruct never writes the `<tool_call>` format on its own, so a
binary format reward has no variance and RL cannot start. The demo therefore runs, into
`outputs/demo/`, each stage a library call equal to the `mrtpo` command it prints:

1. `mrtpo sft`: a short cold start that brings the sampled format rate into 0.2-0.6 (`sft`);
2. `mrtpo eval` of that checkpoint: "before" (`eval-before`);
3. `mrtpo train` with MRTPO from that checkpoint (`train`: metrics.jsonl, curves.png, model);
4. `mrtpo eval` of the result: "after" (`eval-after`), and the before/after table;
5. `mrtpo explain` of the trained model's answer to the first test prompt (`credit`): its
   credit map, where each reward's advantage lands on its tokens, printed on the terminal and
   written to `credit.html` (about 25 s on one idle CPU core: one greedy response 5 s, 4
   sampled for its group 12 s, one replay 3 s, loading and the PNG the rest).

(`--with_base` also evaluates the embedded model first, `eval-base`: it scores 0.) The evals
sample 2 completions per test prompt at temperature 1, as training samples: that is the
distribution RL changes (greedy decoding of the cold-started model already keeps the format
almost always; `mrtpo eval` decodes greedily unless told otherwise).

It ends with the step timings (also written, with the table, to `results.md`), where
`curves.png` is and the command that opens the credit map.

`mrtpo demo --replay-only` is the engine's demo instead: one hand-written text-to-SQL response
(well formed and runnable, but `>=` where the question needs `>`) replayed with the three SQL
rewards' verifier information; it prints each token with its distance per reward.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mrtpo.models import DEFAULT_MODEL

DEMO_TASK = "tool_calling"

# The cold-start budget, measured on the embedded model (recipes/tool_calling.yaml records the
# same). Tool format rate after N steps of 8 demonstrations at lr 5e-5:
#                                             base    1 step   2 steps   3 steps
#   sampled at T=1 (RL's), 32 train prompts   -       2/32     4/32      7/32 (0.22)
#   greedy (mrtpo eval), first 32 test prompts  0/16    0.44     0.78      0.97
# RL learns from the sampled rate: a group of 4 has reward variance with probability
# 1 - p^4 - (1-p)^4, 0.22 at p = 0.06 but 0.63 at p = 0.22. So 3 steps: the format is the
# model's greedy answer, and RL sharpens the sampled distribution towards it.
COLD_START = {
    "max_steps": 3,
    "learning_rate": 5e-5,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 4,
    "max_train_examples": 64,
}
EVAL_EXAMPLES = 32  # test prompts scored before and after (the same ones)
EVAL_SAMPLING = {"temperature": 1.0, "num_samples": 2, "seed": 0}  # as `mrtpo train` samples
EXPLAINED_EXAMPLE = 0  # the test row whose credit map ends the demo
STEP_DIRS = ("eval-base", "sft", "eval-before", "train", "eval-after", "credit")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mrtpo demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", "--output-dir", default="outputs/demo")
    parser.add_argument("--model_name_or_path", "--model-name-or-path", default=DEFAULT_MODEL)
    parser.add_argument(
        "--replay_only",
        "--replay-only",
        action="store_true",
        help="replay one hand-written SQL response and print each token's distance per reward",
    )
    parser.add_argument("--eval_examples", "--eval-examples", type=int, default=EVAL_EXAMPLES)
    parser.add_argument(
        "--max_steps",
        "--max-steps",
        type=int,
        default=None,
        help="MRTPO steps (default: mrtpo train's CPU default, 8: about 10 of the demo's 15 minutes)",
    )
    parser.add_argument(
        "--sft_max_steps", "--sft-max-steps", type=int, default=COLD_START["max_steps"]
    )
    parser.add_argument(
        "--with_base", "--with-base", action="store_true", help="also evaluate the base model"
    )
    args = parser.parse_args(argv)
    if args.eval_examples < 1:
        raise ValueError(f"--eval_examples must be >= 1, got {args.eval_examples}")
    return args


# ----------------------------------------------------------------------------- the training demo


@contextmanager
def demo_step(
    title: str, command: str, options: Mapping[str, Any], timings: dict[str, float]
) -> Iterator[None]:
    """Time one stage, announced with the `mrtpo` command line that does the same."""
    flags = " ".join(f"--{key} {shlex.quote(str(value))}" for key, value in options.items())
    print(f"\n=== {title}: mrtpo {command} {flags}", flush=True)
    started = time.perf_counter()
    yield
    timings[title] = time.perf_counter() - started
    print(f"=== {title}: {timings[title] / 60:.1f} min", flush=True)


def results_markdown(columns: dict[str, dict[str, Any]], timings: dict[str, float]) -> str:
    """The before/after table and the step timings as Markdown."""
    from mrtpo.evaluation import metric_names, metric_value

    names = list(columns)
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for metric in metric_names(columns):
        cells = []
        for result in columns.values():
            value = metric_value(result, metric)
            cells.append("-" if value is None else f"{value:.3f}")
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    lines += ["", "| step | minutes |", "|---|---:|"]
    lines += [f"| {step} | {seconds / 60:.1f} |" for step, seconds in timings.items()]
    lines.append(f"| total | {sum(timings.values()) / 60:.1f} |")
    return "\n".join(lines) + "\n"


def show_credit_map(
    model_name_or_path: str, out: Path, max_new_tokens: int, timings: dict[str, float]
) -> Path:
    """The demo's last stage: the credit map of the model's answer to test row
    `EXPLAINED_EXAMPLE`, on the terminal and in `out/credit.html` (returned)."""
    from mrtpo.explaining import run_explain

    options = {"task": DEMO_TASK, "model_name_or_path": model_name_or_path, "split": "test",
               "example": EXPLAINED_EXAMPLE, "max_new_tokens": max_new_tokens, "output_dir": out}  # fmt: skip
    with demo_step("credit map of a trained response", "explain", options, timings):
        run_explain(**options, title=f"{DEMO_TASK}, test example {EXPLAINED_EXAMPLE}, after MRTPO")
    return out / "credit.html"


def training_demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from mrtpo.cold_start import build_sft_trainer, run_sft, sft_config
    from mrtpo.evaluation import run_eval, summary_table
    from mrtpo.explaining import open_command
    from mrtpo.training import CPU_DEFAULTS, run_training, train_config

    root = Path(args.output_dir)
    for name in STEP_DIRS:  # only the folders this demo writes
        shutil.rmtree(root / name, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    sft_dir, train_dir = str(root / "sft"), str(root / "train")
    max_new_tokens = CPU_DEFAULTS["max_completion_length"]
    timings: dict[str, float] = {}
    columns: dict[str, dict[str, Any]] = {}

    def evaluate(title: str, label: str, model: str, folder: str) -> None:
        options = {"task": DEMO_TASK, "model_name_or_path": model, "split": "test",
                   "max_examples": args.eval_examples, "max_new_tokens": max_new_tokens,
                   "output_dir": str(root / folder), **EVAL_SAMPLING}  # fmt: skip
        with demo_step(title, "eval", options, timings):
            columns[label] = run_eval(**options)

    if args.with_base:
        evaluate("eval base model", "base", args.model_name_or_path, "eval-base")
    sft_task = {"task": DEMO_TASK, "model_name_or_path": args.model_name_or_path,
                "max_train_examples": COLD_START["max_train_examples"]}  # fmt: skip
    sft_budget = {"max_steps": args.sft_max_steps, "learning_rate": COLD_START["learning_rate"],
                  "per_device_train_batch_size": COLD_START["per_device_train_batch_size"],
                  "gradient_accumulation_steps": COLD_START["gradient_accumulation_steps"],
                  "output_dir": sft_dir}  # fmt: skip
    with demo_step("cold start (sft)", "sft", {**sft_task, **sft_budget}, timings):
        run_sft(build_sft_trainer(config=sft_config(**sft_budget), **sft_task), DEMO_TASK)
    evaluate("eval before RL", "before (sft)", sft_dir, "eval-before")
    rl_settings: dict[str, Any] = {"advantage_estimator": "mrtpo", "output_dir": train_dir}
    if args.max_steps is not None:
        rl_settings["max_steps"] = args.max_steps
    train_options = {"task": DEMO_TASK, "model_name_or_path": sft_dir, **rl_settings}
    with demo_step("train (MRTPO)", "train", train_options, timings):
        run_training(DEMO_TASK, sft_dir, train_config(**rl_settings))
    evaluate("eval after RL", "after (MRTPO)", train_dir, "eval-after")

    title = (
        f"{DEMO_TASK} test split, first {args.eval_examples} prompts, "
        f"{EVAL_SAMPLING['num_samples']} samples each at temperature {EVAL_SAMPLING['temperature']:g}"
    )
    print()
    Console().print(summary_table(title, columns))
    page = show_credit_map(train_dir, root / "credit", max_new_tokens, timings)
    results = root / "results.md"
    results.write_text(f"# mrtpo demo\n\n{title}\n\n" + results_markdown(columns, timings))
    print(f"\ndemo took {sum(timings.values()) / 60:.1f} min")
    print(f"before/after table: {results}")
    print(f"reward curves: {root / 'train' / 'curves.png'}")
    print(f"credit map: {page}; open it with {open_command(page)}")
    return 0


# ----------------------------------------------------------------------------- the replay demo

SCHEMA = """CREATE TABLE singer (
  singer_id INTEGER PRIMARY KEY,
  name TEXT,
  country TEXT,
  age INTEGER
);"""
SINGERS = [(1, "Joe Sharp", "Netherlands", 52), (2, "Timbaland", "United States", 32),
           (3, "Justin Brown", "France", 29), (4, "Rose White", "France", 41),
           (5, "John Nizinik", "France", 30)]  # fmt: skip
QUESTION = "What are the names of the singers who are older than 30?"
REFERENCE_SQL = "SELECT name FROM singer WHERE age > 30"
# Well formed and runnable, but `>=` where the question needs `>` (it also returns John, 30).
RESPONSE = (
    "<think>The singer table has an age column; keep singers older than 30.</think>\n"
    "<answer>\nSELECT name FROM singer WHERE age >= 30\n</answer>"
)
FALLBACK_SYSTEM_PROMPT = (
    "You write SQLite queries. Think inside <think>...</think>, then give one SQL query inside "
    "<answer>...</answer>."
)


def demo_database(folder: Path) -> Path:
    """A five-row SQLite database for the replay demo."""
    path = folder / "concert_singer.sqlite"
    with sqlite3.connect(path) as connection:
        connection.execute(SCHEMA)
        connection.executemany("INSERT INTO singer VALUES (?, ?, ?, ?)", SINGERS)
    return path


def sql_system_prompt() -> str:
    from mrtpo import tasks

    try:
        return tasks.get("sql").system_prompt
    except ImportError:  # the SQL task is optional for this demo
        return FALLBACK_SYSTEM_PROMPT


def replay_demo(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from mrtpo.models import load_model
    from mrtpo.relevance import replay_distances
    from mrtpo.tasks.sql.verifiers import SqlExecutable, SqlExecution, SqlFormat

    model, tokenizer = load_model(args.model_name_or_path)
    messages = [
        {"role": "system", "content": sql_system_prompt()},
        {"role": "user", "content": f"Database schema:\n{SCHEMA}\n\nQuestion: {QUESTION}"},
    ]
    verifiers = [SqlFormat(), SqlExecutable(), SqlExecution()]
    with tempfile.TemporaryDirectory() as folder:
        example = {
            "prompt": messages,
            "db_path": str(demo_database(Path(folder))),
            "reference_sql": REFERENCE_SQL,
        }
        verdicts = [verifier.verify(RESPONSE, example) for verifier in verifiers]
    completion_ids = tokenizer(RESPONSE, add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]
    with torch.no_grad():
        distance, mask = replay_distances(
            model, tokenizer, [messages], [completion_ids], [[verdict.info for verdict in verdicts]]
        )
    distance = distance[0].float()  # (K, T)

    console = Console()
    console.print(f"[bold]Question:[/bold] {QUESTION}\n[bold]Reference:[/bold] {REFERENCE_SQL}")
    for verifier, verdict in zip(verifiers, verdicts, strict=True):
        console.print(f"[bold]{verifier.name}[/bold] = {verdict.score}", highlight=False)
    table = Table(title="replay distance per token (leave-one-out, JS distance in [0, 1])")
    table.add_column("#", justify="right")
    table.add_column("token")
    for verifier in verifiers:
        table.add_column(verifier.name, justify="right")
    top = distance.max(dim=1).values
    for t, token_id in enumerate(completion_ids):
        if not mask[0, t]:
            continue
        cells = []
        for k in range(len(verifiers)):
            value = distance[k, t].item()
            style = "bold red" if value >= 0.5 * top[k].item() > 0 else ""
            cells.append(f"[{style}]{value:.3f}[/{style}]" if style else f"{value:.3f}")
        token = tokenizer.decode([token_id])
        table.add_row(str(t), repr(token)[1:-1], *cells)
    console.print(table)
    means = ", ".join(
        f"{v.name} {distance[k][mask[0].bool()].mean().item():.3f}" for k, v in enumerate(verifiers)
    )
    console.print(
        f"mean distance per reward: {means}; bold red: at least half the reward's maximum"
    )
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    return replay_demo(args) if args.replay_only else training_demo(args)
