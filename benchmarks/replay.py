"""Replay benchmark: MRTPO's replay vs. one forward pass and vs. the naive replay.

On a tiny-but-not-trivial Llama (4 layers, hidden 256, vocabulary 49,152, seeded, built here)
with prompts of 512 tokens, 48 tokens of verifier information per reward, completions of 128
tokens and 8 rows (2 prompts x G = 4), for K in {1, 3, 8}, it reports:

- replay time / the time of one forward pass over the same rows (prompt + completion, the
  completion's logits only, as TRL computes per-token log-probabilities);
- replay time / naive replay time (`mrtpo.relevance.naive_replay_distances`: every full
  context run from scratch, all (N, K + 1, T, V) completion logits kept, JS taken at once);
- peak memory of replay / of the naive replay.

Times: the three are run side by side in one process, `--runs` times, in rotating order;
medians. Single-threaded by default (`--threads`): on a shared CPU, one thread keeps the
ratios stable. Memory: each measurement runs alone in a fresh subprocess that builds the same model
and inputs, resets the kernel's resident-set high-water mark (`resident_memory.py`: checked, an error where
the kernel keeps the old peak), runs the call once, and reads `VmHWM`: peak RSS during the call minus RSS before it. Tensor
memory on CPU is plain malloc'd memory, so this counts every buffer the call touched at its
peak (a Python-level tracer such as tracemalloc sees none of it).

Unless `--quick` or `--no-smollm`, the same figures are taken on the embedded
SmolLM2-135M-Instruct (`mrtpo.models.load_model`), K = 3, with SQL-sized chat prompts
(`--smollm-runs` timed runs: minutes each on CPU).

`--contrastive` measures instead what contrastive relevance (`token_relevance="contrastive"`)
costs over the plain replay: `contrastive_replay_distances` (the rows replayed with their own
and with a placebo's information, in one call) against `replay_distances`, side by side in
rotating order, on the synthetic rows (K = 1, 3, 8) and SmolLM2 (K = 3). The placebo differs
from the own text in every pair, as on the instruction-following and tool tasks (where a text
equal to the own runs once): on the synthetic rows another prompt's information
(`controls.placebo_infos`); on the SmolLM2 rows, whose two SQL prompts have the same
information, each row's own pieces rotated by one reward (other texts, the same lengths and
the same sharing between rows).

    .venv/bin/python benchmarks/replay.py            # the full table
    .venv/bin/python benchmarks/replay.py --quick    # one run, synthetic model, K = 8 memory
    .venv/bin/python benchmarks/replay.py --contrastive --runs 5 --smollm-runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import resident_memory
import torch

from mrtpo.relevance import (
    contrastive_replay_distances,
    controls,
    naive_replay_distances,
    replay_distances,
)

VOCAB = 49_152
PROMPT_TOKENS = 512
INFO_TOKENS = 48
COMPLETION_TOKENS = 128
PROMPTS = 2
GROUP_SIZE = 4


# ----------------------------------------------------------------------------- synthetic setup


class WordTokenizer:
    """Token ``n`` is the word ``t<n>``: texts of exact token counts, for plain-string prompts.

    The benchmark measures the replay, not tokenization; this keeps the lengths exact.
    """

    pad_token_id = 0
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [int(word[1:]) for word in text.split()]}

    @staticmethod
    def text(ids: list[int]) -> str:
        return " ".join(f"t{i}" for i in ids)


def synthetic_model(seed: int = 0) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def synthetic_inputs(num_rewards: int, seed: int = 0) -> tuple[list, list, list]:
    """2 prompts x G = 4 rows: prompts of 512 tokens, K infos of 48, completions of 128."""
    gen = torch.Generator().manual_seed(seed)

    def words(count: int) -> list[int]:
        return torch.randint(3, VOCAB, (count,), generator=gen).tolist()

    prompts, completions, infos = [], [], []
    for _ in range(PROMPTS):
        prompt = WordTokenizer.text(words(PROMPT_TOKENS))
        for _ in range(GROUP_SIZE):
            prompts.append(prompt)
            completions.append(words(COMPLETION_TOKENS))
            infos.append([WordTokenizer.text(words(INFO_TOKENS)) for _ in range(num_rewards)])
    return prompts, completions, infos


# ----------------------------------------------------------------------------- SmolLM2 setup

SQL_SCHEMA_TABLES = [
    ("singer", ["singer_id INTEGER PRIMARY KEY", "name TEXT", "country TEXT", "age INTEGER"]),
    (
        "concert",
        [
            "concert_id INTEGER PRIMARY KEY",
            "concert_name TEXT",
            "theme TEXT",
            "year INTEGER",
            "stadium_id INTEGER",
        ],
    ),
    (
        "stadium",
        [
            "stadium_id INTEGER PRIMARY KEY",
            "location TEXT",
            "name TEXT",
            "capacity INTEGER",
            "highest INTEGER",
            "lowest INTEGER",
            "average INTEGER",
        ],
    ),
    (
        "singer_in_concert",
        [
            "concert_id INTEGER",
            "singer_id TEXT",
            "FOREIGN KEY (concert_id) REFERENCES concert(concert_id)",
        ],
    ),
    (
        "album",
        [
            "album_id INTEGER PRIMARY KEY",
            "singer_id INTEGER",
            "title TEXT",
            "released INTEGER",
            "sales REAL",
        ],
    ),
]
SQL_QUESTIONS = [
    "What are the names of the singers older than 30 who performed in a concert in 2014, ordered by age?",
    "For each stadium, how many concerts were held there, and what is its capacity?",
]
SQL_RESPONSES = [
    "<think>I need singers joined with concerts filtered by year and age.</think>"
    "<answer>SELECT DISTINCT s.name FROM singer AS s JOIN singer_in_concert AS sc ON s.singer_id = sc.singer_id "
    "JOIN concert AS c ON c.concert_id = sc.concert_id WHERE c.year = 2014 AND s.age > 30 ORDER BY s.age</answer>",
    "<think>Join singer and concert.</think><answer>SELECT name FROM singer WHERE age > 30</answer>",
    "<answer>SELECT s.name FROM singer s, concert c WHERE c.year = 2014 AND s.age > 30 ORDER BY age</answer>",
    "<think>Count concerts per stadium.</think><answer>SELECT st.name, COUNT(*), st.capacity FROM stadium AS st "
    "JOIN concert AS c ON c.stadium_id = st.stadium_id GROUP BY st.stadium_id</answer>",
]


def smollm_inputs(tokenizer: Any) -> tuple[list, list, list]:
    """2 SQL chat prompts x G = 4 rows, K = 3 infos (format, executability, execution)."""
    schema = "\n".join(
        f"CREATE TABLE {name} ({', '.join(cols)});" for name, cols in SQL_SCHEMA_TABLES
    )
    system = (
        "You are a text-to-SQL assistant. Think briefly inside <think>...</think>, then give one "
        "SQLite query inside <answer>...</answer>."
    )
    prompts, completions, infos = [], [], []
    for question in SQL_QUESTIONS:
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Database schema:\n{schema}\n\nQuestion: {question}"},
        ]
        for g in range(GROUP_SIZE):
            response = SQL_RESPONSES[g]
            ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [
                tokenizer.eos_token_id
            ]
            prompts.append(messages)
            completions.append(ids)
            infos.append(
                [
                    "Required format: <think>reasoning</think><answer>one SQLite query</answer>",
                    f"Database schema:\n{schema}\nExecution: "
                    + ("ok" if g != 1 else "error: no such column: nme"),
                    "Reference query: SELECT DISTINCT T1.name FROM singer AS T1 JOIN singer_in_concert "
                    "AS T2 ON T1.singer_id = T2.singer_id JOIN concert AS T3 ON T2.concert_id = "
                    "T3.concert_id WHERE T3.year = 2014 AND T1.age > 30 ORDER BY T1.age\n"
                    "Reference result (first rows): [('Joe Sharp',), ('John Nizinik',)]",
                ]
            )
    return prompts, completions, infos


# ----------------------------------------------------------------------------- calls measured


@dataclass
class Setup:
    model: Any
    tokenizer: Any
    prompts: list
    completions: list
    infos: list
    chat: bool
    placebo: list | None = None  # the placebo's information (`--contrastive` only)


def build(setting: str, num_rewards: int) -> Setup:
    if setting == "smollm":
        from mrtpo.models import load_model

        model, tokenizer = load_model("smollm2-135m-instruct")
        model.eval()
        return Setup(model, tokenizer, *smollm_inputs(tokenizer), chat=True)
    return Setup(synthetic_model(), WordTokenizer(), *synthetic_inputs(num_rewards), chat=False)


def forward_once(setup: Setup) -> None:
    """One forward pass over the rows (prompt + completion), completion logits only (as TRL)."""
    tokenizer = setup.tokenizer
    rows = []
    for prompt, completion in zip(setup.prompts, setup.completions, strict=True):
        if setup.chat:
            text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            prompt_ids = tokenizer(prompt)["input_ids"]
        rows.append(prompt_ids + completion)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):  # left padding, as TRL pads prompts
        input_ids[i, width - len(r) :] = torch.tensor(r)
        attention[i, width - len(r) :] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    keep = max(len(c) for c in setup.completions) + 1
    with torch.no_grad():
        setup.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            logits_to_keep=keep,
        ).logits.sum()


def replay_once(setup: Setup) -> torch.Tensor:
    distance, _ = replay_distances(
        setup.model, setup.tokenizer, setup.prompts, setup.completions, setup.infos
    )
    return distance


def naive_once(setup: Setup) -> torch.Tensor:
    distance, _ = naive_replay_distances(
        setup.model, setup.tokenizer, setup.prompts, setup.completions, setup.infos, batch_size=16
    )
    return distance


def contrastive_once(setup: Setup) -> torch.Tensor:
    distance, _, _ = contrastive_replay_distances(
        setup.model, setup.tokenizer, setup.prompts, setup.completions, setup.infos, setup.placebo
    )
    return distance


CALLS = {
    "forward": forward_once,
    "replay": replay_once,
    "naive": naive_once,
    "contrastive": contrastive_once,
}


def first_row(setup: Setup) -> Setup:
    """The first row alone: a cheap warm-up of the same code paths."""
    return Setup(
        setup.model,
        setup.tokenizer,
        setup.prompts[:1],
        setup.completions[:1],
        setup.infos[:1],
        setup.chat,
        None if setup.placebo is None else setup.placebo[:1],
    )


# ----------------------------------------------------------------------------- memory


def measure_memory_here(setting: str, num_rewards: int, call: str) -> dict[str, float]:
    """Peak extra resident memory (MiB) of one call, in this (fresh) process."""
    setup = build(setting, num_rewards)
    CALLS[call](first_row(setup))  # warm-up: lazy initializations are not the call's memory
    import gc

    gc.collect()
    return {"peak_mib": resident_memory.peak_above_start_mib(lambda: CALLS[call](setup))}


def measure_memory(setting: str, num_rewards: int, call: str) -> float:
    command = [sys.executable, __file__, "--memory-child", setting, str(num_rewards), call]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"memory measurement failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["peak_mib"]


# ----------------------------------------------------------------------------- timing


def measure_times(setup: Setup, runs: int, calls: tuple[str, ...]) -> tuple[dict, dict]:
    """Seconds per call (and each call's last output), interleaved in rotating order."""
    for name in calls:
        CALLS[name](first_row(setup))
    times: dict[str, list[float]] = {name: [] for name in calls}
    outputs: dict[str, Any] = {}
    for run in range(runs):
        order = calls[run % len(calls) :] + calls[: run % len(calls)]
        for name in order:
            started = time.perf_counter()
            outputs[name] = CALLS[name](setup)
            times[name].append(time.perf_counter() - started)
    return times, outputs


def row(setting: str, num_rewards: int, runs: int, memory: bool) -> dict[str, Any]:
    setup = build(setting, num_rewards)
    times, outputs = measure_times(setup, runs, ("forward", "replay", "naive"))
    agreement = float((outputs["replay"] - outputs["naive"]).abs().max())
    median = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "setting": setting,
        "K": num_rewards,
        "forward_s": median["forward"],
        "replay_s": median["replay"],
        "naive_s": median["naive"],
        "replay_over_forward": statistics.median(
            r / f for r, f in zip(times["replay"], times["forward"], strict=True)
        ),
        "replay_over_naive": statistics.median(
            r / n for r, n in zip(times["replay"], times["naive"], strict=True)
        ),
        "max_abs_diff": agreement,
        "prompt_tokens": _prompt_tokens(setup),
    }
    if memory:
        result["replay_mib"] = measure_memory(setting, num_rewards, "replay")
        result["naive_mib"] = measure_memory(setting, num_rewards, "naive")
        result["memory_ratio"] = result["replay_mib"] / result["naive_mib"]
    return result


def _prompt_tokens(setup: Setup) -> int:
    from mrtpo.relevance import build_contexts

    return len(build_contexts(setup.tokenizer, setup.prompts[0], setup.infos[0]).prefix)


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| model | K | prompt tokens | forward (s) | replay (s) | naive (s) | replay / forward | "
        "replay / naive (time) | replay peak (MiB) | naive peak (MiB) | replay / naive (memory) | "
        "max |replay - naive| |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        memory = (
            f"{r['replay_mib']:.0f} | {r['naive_mib']:.0f} | {r['memory_ratio']:.2f}"
            if "replay_mib" in r
            else "- | - | -"
        )
        lines.append(
            f"| {r['setting']} | {r['K']} | {r['prompt_tokens']} | {r['forward_s']:.3f} | "
            f"{r['replay_s']:.3f} | {r['naive_s']:.3f} | {r['replay_over_forward']:.2f} | "
            f"{r['replay_over_naive']:.2f} | {memory} | {r['max_abs_diff']:.1e} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- contrastive


def placebo_for(setup: Setup) -> list[list[str]]:
    """Information unlike each row's own, for the contrastive replay (see the docstring)."""
    if setup.chat:  # the SQL rows' two prompts share their information: rotate the rewards'
        return [row[1:] + row[:1] for row in setup.infos]
    return controls.placebo_infos(setup.infos, GROUP_SIZE, seed=0, step=0)


def contrastive_row(setting: str, num_rewards: int, runs: int) -> dict[str, Any]:
    setup = build(setting, num_rewards)
    setup.placebo = placebo_for(setup)
    overall, _ = controls.placebo_shares(setup.infos, setup.placebo)
    times, _ = measure_times(setup, runs, ("replay", "contrastive"))
    return {
        "setting": setting,
        "K": num_rewards,
        "runs": runs,
        "placebo_equal_share": overall.equal,
        "replay_s": statistics.median(times["replay"]),
        "contrastive_s": statistics.median(times["contrastive"]),
        "contrastive_over_replay": statistics.median(
            c / r for c, r in zip(times["contrastive"], times["replay"], strict=True)
        ),
    }


def contrastive_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| model | K | timed runs | placebo = own (pairs) | replay (s) | contrastive (s) | "
        "contrastive / replay |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['setting']} | {r['K']} | {r['runs']} | {r['placebo_equal_share']:.0%} | "
            f"{r['replay_s']:.3f} | {r['contrastive_s']:.3f} | "
            f"{r['contrastive_over_replay']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per call (median)")
    parser.add_argument(
        "--quick", action="store_true", help="1 run, no SmolLM2, memory for K = 8 only"
    )
    parser.add_argument("--no-smollm", action="store_true", help="skip the SmolLM2-135M rows")
    parser.add_argument(
        "--smollm-runs",
        type=int,
        default=1,
        help="timed runs on SmolLM2-135M (minutes each on CPU)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1: stable ratios on a shared machine; 0: torch's default)",
    )
    parser.add_argument(
        "--contrastive",
        action="store_true",
        help="time contrastive relevance's replay against the plain replay instead",
    )
    parser.add_argument("--memory-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        torch.set_num_threads(1)
        setting, num_rewards, call = args.memory_child
        print(json.dumps(measure_memory_here(setting, int(num_rewards), call)))
        return

    if args.threads:
        torch.set_num_threads(args.threads)
    runs = 1 if args.quick else args.runs
    if args.contrastive:
        contrastive = [contrastive_row("synthetic", k, runs) for k in (1, 3, 8)]
        for result in contrastive:
            print(json.dumps(result), flush=True)
        if not (args.quick or args.no_smollm):
            contrastive.append(contrastive_row("smollm", 3, args.smollm_runs))
            print(json.dumps(contrastive[-1]), flush=True)
        print(f"torch threads: {torch.get_num_threads()}, load average: {os.getloadavg()}")
        print(contrastive_table(contrastive))
        return
    results = []
    for num_rewards in (1, 3, 8):
        memory = not args.quick or num_rewards == 8
        results.append(row("synthetic", num_rewards, runs, memory))
        print(json.dumps(results[-1]), flush=True)
    if not (args.quick or args.no_smollm):
        results.append(row("smollm", 3, args.smollm_runs, memory=True))
        print(json.dumps(results[-1]), flush=True)
    print(f"torch threads: {torch.get_num_threads()}, load average: {os.getloadavg()}")
    print(table(results))


if __name__ == "__main__":
    main()
