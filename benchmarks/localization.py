"""Benchmark: does each reward's replay distance land on an error injected at a known place?

Ground truth instead of pooled statistics. For each bundled task we take correct responses
(the task's reference responses; for instruction following, responses built here to satisfy
every constraint of a row, see `build_instruction_response`), inject one controlled error at a
known character span, score the result with the task's own verifiers, keep it only if exactly
the intended rewards flip, replay it with the policy (`mrtpo.relevance`, both replay modes) and
measure where each reward's distance falls.

For reward k of one response with T tokens (the eos token included, as training replays it)
and S the tokens overlapping the injected span:

    ratio_k = (sum_{t in S} q_{k,t} / sum_t q_{k,t}) / (|S| / T)      (1 = uniform)

Per task, error kind and replay mode we report, over the kept responses: the failing reward's
median ratio and the share of responses above 1; the same for the rewards the error does not
concern (those whose verdict did not change), averaged per response; the specificity (failing
reward's ratio minus the mean ratio of the unconcerned rewards, same tokens), its median; how
often the failing reward's ratio ranks first among the response's rewards; and the failing
reward's ratio after its distances are shuffled within the response
(`mrtpo.advantages.shuffle_weights`, one permutation per response: the null of the shuffle
ablation). Outputs in `--out`: `localization.md` (tables), `localization.png` (figure),
`localization.json` (every response's ratios). The injected errors and the correct responses
they start from: `localization_errors.py`.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/localization.py --n 12
    .venv/bin/python benchmarks/localization.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mrtpo import tasks
from mrtpo.advantages import shuffle_weights
from mrtpo.credit.map import CreditMap
from mrtpo.explaining import replay_rows
from mrtpo.models import DEFAULT_MODEL

Span = tuple[int, int]
REPLAY_MODES = ("leave_one_out", "add_one")
SPAN_MARKER = "@@INJECTED@@"  # stands for a JSON value or key while its position is found


sys.path.insert(0, str(Path(__file__).resolve().parent))
from localization_errors import (  # noqa: E402  (the injected errors)
    ERROR_KINDS,
    Injected,
    collect_injections,
)

# ----------------------------------------------------------------------------- metrics


def span_ratio(distance: np.ndarray, in_span: np.ndarray) -> float | None:
    """The share of `distance` on the span's tokens over their share of the response.

    distance: [T] one reward's distances over a response's tokens; in_span: [T] bool.
    None when the reward has no distance at all or the span holds no token.
    """
    total = float(distance.sum())
    if total <= 0 or not in_span.any():
        return None
    return (float(distance[in_span].sum()) / total) / (float(in_span.sum()) / len(distance))


def response_ratios(
    distance: np.ndarray, in_span: np.ndarray, names: Sequence[str], applicable: Sequence[bool]
) -> dict[str, float | None]:
    """{reward: span_ratio} over the applicable rewards. distance: [K, T]; in_span: [T]."""
    return {name: span_ratio(distance[k], in_span) for k, name in enumerate(names) if applicable[k]}


def shuffled_distance(distance: np.ndarray, seed: int) -> np.ndarray:
    """[K, T] each reward's distances permuted among the response's tokens (seeded): the
    shuffle ablation's null (`mrtpo.advantages.shuffle_weights`, one permutation per reward)."""
    generator = torch.Generator().manual_seed(seed)
    tensor = torch.as_tensor(distance, dtype=torch.float64)[None]
    mask = torch.ones(1, tensor.shape[-1])
    return shuffle_weights(tensor, mask, generator)[0].numpy()


def measure(
    injected: Injected, distance: np.ndarray, in_span: np.ndarray, seed: int
) -> dict[str, Any]:
    """One response's record: its ratios, the shuffled ratios, and which rewards it concerns.

    distance: [K, T] the replay distances; in_span: [T] the injected span's tokens.
    """
    applicable = [verdict.score is not None for verdict in injected.verdicts]
    candidate = injected.candidate
    return {
        "task": injected.task,
        "kind": injected.kind,
        "target": candidate.target,
        "drops": list(candidate.drops),
        "unconcerned": [
            name
            for name, keep in zip(injected.names, applicable, strict=True)
            if keep and name not in candidate.drops
        ],
        "types": {
            name: kind
            for name, kind, keep in zip(injected.names, injected.types, applicable, strict=True)
            if keep
        },
        "tokens": int(len(in_span)),
        "span_tokens": int(in_span.sum()),
        "ratios": response_ratios(distance, in_span, injected.names, applicable),
        "shuffled": response_ratios(
            shuffled_distance(distance, seed), in_span, injected.names, applicable
        ),
    }


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _above_one(values: Sequence[float]) -> float | None:
    return sum(value > 1 for value in values) / len(values) if values else None


def _quartiles(values: Sequence[float]) -> tuple[float, float] | None:
    return (float(np.percentile(values, 25)), float(np.percentile(values, 75))) if values else None


def summarize(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (task, kind, mode) in first-seen order: n, the failing reward's median ratio,
    quartiles and share above 1; the unconcerned rewards' (mean per response) median and share
    above 1; the specificity's median; the share of responses whose failing reward ranks first;
    the shuffled failing reward's median and share above 1. A response whose failing reward
    has no distance counts in `undefined` (left out of the statistics)."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["task"], record["kind"], record["mode"]), []).append(record)
    rows = []
    for (task, kind, mode), group in groups.items():
        target, others, specificity, first, shuffled, placebo = [], [], [], [], [], []
        for record in group:
            ratio = record["ratios"][record["target"]]
            if ratio is None:
                continue
            target.append(ratio)
            # An unconcerned reward without any distance has no ratio: left out, not counted 0.
            rest = [
                record["ratios"][name]
                for name in record["unconcerned"]
                if record["ratios"][name] is not None
            ]
            if rest:
                others.append(float(np.mean(rest)))
                specificity.append(ratio - others[-1])
            competitors = [
                value or 0.0 for name, value in record["ratios"].items() if name != record["target"]
            ]
            first.append(all(ratio > value for value in competitors))
            if record["shuffled"][record["target"]] is not None:
                shuffled.append(record["shuffled"][record["target"]])
            if (record.get("placebo") or {}).get(record["target"]) is not None:
                placebo.append(record["placebo"][record["target"]])
        rows.append(
            {
                "task": task,
                "kind": kind,
                "mode": mode,
                "failing": group[0]["types"][group[0]["target"]],
                "n": len(target),
                "undefined": len(group) - len(target),
                "span_share": float(np.mean([r["span_tokens"] / r["tokens"] for r in group])),
                "median": _median(target),
                "quartiles": _quartiles(target),
                "above_one": _above_one(target),
                "unconcerned_median": _median(others),
                "unconcerned_above_one": _above_one(others),
                "specificity_median": _median(specificity),
                "ranks_first": sum(first) / len(first) if first else None,
                "shuffled_median": _median(shuffled),
                "shuffled_above_one": _above_one(shuffled),
                "placebo_median": _median(placebo),
                "placebo_above_one": _above_one(placebo),
            }
        )
    return rows


def per_reward_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (task, kind, mode, reward type): its role (failing, also failing,
    unconcerned), n, median ratio and share above 1. Types, not names: an instruction slot
    checks a different constraint on each row."""
    groups: dict[tuple[str, str, str, str], list[float]] = {}
    roles: dict[tuple[str, str, str, str], str] = {}
    for record in records:
        for name, ratio in record["ratios"].items():
            key = (record["task"], record["kind"], record["mode"], record["types"][name])
            groups.setdefault(key, [])
            if ratio is not None:
                groups[key].append(ratio)
            roles[key] = (
                "failing"
                if name == record["target"]
                else "also failing"
                if name in record["drops"]
                else "unconcerned"
            )
    order = {key[:3]: index for index, key in reversed(list(enumerate(groups)))}
    ranks = {"failing": 0, "also failing": 1, "unconcerned": 2}
    keys = sorted(groups, key=lambda key: (order[key[:3]], ranks[roles[key]], key[3]))
    return [
        {
            "task": task,
            "kind": kind,
            "mode": mode,
            "reward": reward,
            "role": roles[(task, kind, mode, reward)],
            "n": len(values),
            "median": _median(values),
            "above_one": _above_one(values),
        }
        for task, kind, mode, reward in keys
        for values in [groups[(task, kind, mode, reward)]]
    ]


# ----------------------------------------------------------------------------- outputs


def _number(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _share(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f}%"


def summary_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The summary table (one row per task, kind and mode) as Markdown."""
    lines = [
        "| task | error | mode | failing reward | n | span tokens | ratio (median) | > 1 "
        "| unconcerned ratio | specificity | ranks first | shuffled ratio | shuffled > 1 "
        "| placebo ratio | placebo > 1 |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['task']} | {row['kind']} | {row['mode']} | {row['failing']} | {row['n']} "
            f"| {_share(row['span_share'], 1)} | {_number(row['median'])} | {_share(row['above_one'])} "
            f"| {_number(row['unconcerned_median'])} | {_number(row['specificity_median'])} "
            f"| {_share(row['ranks_first'])} | {_number(row['shuffled_median'])} "
            f"| {_share(row['shuffled_above_one'])} "
            f"| {_number(row.get('placebo_median'))} | {_share(row.get('placebo_above_one'))} |"
        )
    return "\n".join(lines) + "\n"


def per_reward_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """Every reward's median ratio per task, kind and mode, as Markdown."""
    lines = [
        "| task | error | mode | reward | role | n | ratio (median) | > 1 |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['task']} | {row['kind']} | {row['mode']} | {row['reward']} | {row['role']} "
            f"| {row['n']} | {_number(row['median'])} | {_share(row['above_one'])} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """One panel per replay mode: per error kind, the failing reward's median ratio (with its
    quartiles), the unconcerned rewards' and the shuffled failing reward's; log scale."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    modes = list(dict.fromkeys(row["mode"] for row in rows))
    figure = Figure(figsize=(13, 4.6 * len(modes)), dpi=110)
    for index, mode in enumerate(modes):
        axes = figure.add_subplot(len(modes), 1, index + 1)
        here = [row for row in rows if row["mode"] == mode]
        x = np.arange(len(here))
        for offset, key, label, color in (
            (-0.2, "median", "failing reward", "tab:red"),
            (0.0, "unconcerned_median", "unconcerned rewards", "tab:blue"),
            (0.2, "shuffled_median", "failing reward, shuffled", "tab:gray"),
            (0.3, "placebo_median", "failing reward, placebo", "tab:olive"),
        ):
            values = [np.nan if row.get(key) is None else row[key] for row in here]
            axes.scatter(x + offset, values, color=color, label=label, zorder=3)
        for position, row in zip(x, here, strict=True):
            if row["quartiles"] is not None:
                low, high = row["quartiles"]
                axes.vlines(position - 0.2, low, high, color="tab:red", alpha=0.5)
        axes.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        axes.set_yscale("log")
        labels = [f"{row['task']}: {row['kind']}" for row in here]
        axes.set_xticks(x, labels, fontsize=7, rotation=25, ha="right")
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.tick_params(axis="y", which="minor", labelsize=6)
        axes.set_ylabel("distance share / token share")
        axes.set_title(f"Injected errors, replay mode {mode} (median over responses; bar: IQR)")
        axes.grid(alpha=0.3, axis="y")
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    figure.savefig(path, format="png")


# ----------------------------------------------------------------------------- main


def task_rows(task: Any, seed: int) -> list[dict[str, Any]]:
    """The test split's rows, then the train split's, each shuffled by `seed`."""
    rows = []
    for split in ("test", "train"):
        split_rows = [dict(row) for row in task.load(split)]
        random.Random(seed).shuffle(split_rows)
        rows += split_rows
    return rows


def row_id(row: Mapping[str, Any]) -> str:
    """A task row's identifier: `id` where the task has one (SQL, tools), else `key` (IFEval)."""
    return str(row.get("id", row.get("key")))


def placebo_partners(injected: Sequence[Injected], seed: int) -> list[int | None]:
    """For each injected response, the index of another one whose verifier information it is
    replayed with in the placebo: a response of another row with as many rewards, the first such
    after it in a seeded cyclic order (None when there is none)."""
    order = list(range(len(injected)))
    random.Random(seed).shuffle(order)
    partners: list[int | None] = [None] * len(injected)
    for position, index in enumerate(order):
        for step in range(1, len(order)):
            other = order[(position + step) % len(order)]
            mine, theirs = injected[index], injected[other]
            if row_id(mine.row) != row_id(theirs.row) and len(mine.verdicts) == len(
                theirs.verdicts
            ):
                partners[index] = other
                break
    return partners


def replay_injected(
    model: Any, tokenizer: Any, injected: Sequence[Injected], mode: str, seed: int
) -> list[dict[str, Any]]:
    """Replay the injected responses (their text tokenized once, plus eos) and measure each;
    then replay them again with another row's verifier information (`placebo_partners`) and
    measure the failing reward's span ratio there (the placebo control)."""
    ids = [
        list(tokenizer(item.candidate.text, add_special_tokens=False)["input_ids"])
        + [tokenizer.eos_token_id]
        for item in injected
    ]
    distances = replay_rows(
        model,
        tokenizer,
        [item.row["prompt"] for item in injected],
        ids,
        [item.verdicts for item in injected],
        mode=mode,
    )
    partners = placebo_partners(injected, seed)
    placebo_distances = replay_rows(
        model,
        tokenizer,
        [item.row["prompt"] for item in injected],
        ids,
        [
            injected[p].verdicts if p is not None else item.verdicts
            for item, p in zip(injected, partners, strict=True)
        ],  # fmt: skip
        mode=mode,
    )
    records = []
    for index, (item, row_ids, distance) in enumerate(zip(injected, ids, distances, strict=True)):
        credit_map = CreditMap.from_replay(
            tokenizer,
            row_ids,
            item.names,
            distance,
            verdicts=item.verdicts,
            text=item.candidate.text,
        )
        in_span = credit_map.tokens_in_spans([item.candidate.span])
        record = measure(item, credit_map.distance, in_span, seed + index)
        placebo = None
        if partners[index] is not None:
            # The same tokens (the credit map's cut of the replay) under another row's information.
            cut = placebo_distances[index].numpy()[:, : credit_map.distance.shape[1]]
            applicable = [verdict.score is not None for verdict in item.verdicts]
            placebo = response_ratios(cut, in_span, item.names, applicable)
        records.append({**record, "placebo": placebo, "mode": mode, "row_id": row_id(item.row)})
    return records


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model_name_or_path", default=DEFAULT_MODEL)
    parser.add_argument("--n", type=int, default=12, help="responses per error kind")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/localization"))
    parser.add_argument("--tasks", nargs="+", default=list(dict.fromkeys(k.task for k in ERROR_KINDS)))  # fmt: skip
    parser.add_argument("--modes", nargs="+", default=list(REPLAY_MODES), choices=REPLAY_MODES)
    parser.add_argument("--seed", type=int, default=0, help="row order and shuffles")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--report", action="store_true", help="only rewrite the tables and figure from --out's JSON"
    )
    args = parser.parse_args(argv)
    if args.n < 1:
        raise SystemExit(f"--n must be >= 1, got {args.n}")
    return args


def run(args: argparse.Namespace, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """The whole benchmark; the loaded model may be given (tests pass the tiny one)."""
    if model is None:
        from mrtpo.models import load_model

        model, tokenizer = load_model(args.model_name_or_path)
        device = (
            args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
        )
        model = model.to(device)
    started = time.perf_counter()
    injected: list[Injected] = []
    counts: dict[str, dict[str, int]] = {}
    for task_name in args.tasks:
        task = tasks.get(task_name)
        rows = task_rows(task, args.seed)
        for kind in (kind for kind in ERROR_KINDS if kind.task == task_name):
            kept, counted = collect_injections(kind, task, rows, args.n)
            injected += kept
            counts[f"{task_name}/{kind.name}"] = {**counted, "kept": len(kept)}
    records = []
    for mode in args.modes:
        for task_name in args.tasks:
            batch = [item for item in injected if item.task == task_name]
            if batch:
                began = time.perf_counter()
                records += replay_injected(model, tokenizer, batch, mode, args.seed)
                seconds = time.perf_counter() - began
                print(f"{mode}, {task_name}: {len(batch)} responses in {seconds:.0f} s", flush=True)
    return {
        "command": "",
        "model": args.model_name_or_path,
        "seconds": round(time.perf_counter() - started, 1),
        "counts": counts,
        "kinds": {f"{k.task}/{k.name}": k.description for k in ERROR_KINDS},
        "summary": summarize(records),
        "per_reward": per_reward_rows(records),
        "records": records,
    }


LEGEND = """Medians over the responses of each error kind. *ratio*: the share of the failing
reward's replay distance on the injected span's tokens over the span's share of the response's
tokens (1 = uniform; *> 1*: the share of responses above 1). *unconcerned*: the same for the
rewards whose verdict the error does not change (mean per response). *specificity*: failing
minus unconcerned, per response. *ranks first*: the failing reward's ratio is the largest of
the response's rewards. *shuffled*: the failing reward's distances permuted within the response
(one permutation: the shuffle ablation's null). *placebo*: the failing reward's ratio when the
response is replayed with the verifier information of another row's response (as
`replay_information="placebo"` trains). "–": no reward the error leaves alone (or, for the
placebo, a response with no partner).
"""


def write_outputs(result: dict[str, Any], out: Path) -> None:
    """`localization.json`, `localization.md` and `localization.png` into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "localization.json").write_text(json.dumps(result, indent=1))
    counts = "\n".join(
        f"- {name}: {result['kinds'][name]} {count['kept']} kept of {count['rows']} rows tried "
        f"({count['not_applicable']} not applicable, {count['no_reference']} without a "
        f"reference, {count['no_intended_flip']} without the intended verdict change)."
        for name, count in result["counts"].items()
    )
    (out / "localization.md").write_text(
        f"# Localization of injected errors\n\n    {result['command']}\n\n"
        f"Model: {result['model']}; {result['seconds']:.0f} s.\n\n"
        + LEGEND
        + "\n"
        + summary_markdown(result["summary"])
        + "\n## Every reward\n\n"
        + per_reward_markdown(result["per_reward"])
        + "\n## Injections\n\n"
        + counts
        + "\n\nInstruction following has no reference responses: one is built per row whose "
        "constraints are all of the kinds the builder knows and can meet together "
        "(`build_instruction_response`); the other rows count as without a reference." + "\n"
    )
    plot(result["summary"], out / "localization.png")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.report:  # the tables and the figure again, from the records alone
        result = json.loads((args.out / "localization.json").read_text())
        result.update(summary=summarize(result["records"]), per_reward=per_reward_rows(result["records"]))  # fmt: skip
        write_outputs(result, args.out)
        print(
            f"wrote {args.out / 'localization.md'} and .png from {args.out / 'localization.json'}"
        )
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    result["command"] = shlex.join(["python", "benchmarks/localization.py", *sys.argv[1:]])
    write_outputs(result, args.out)
    print(summary_markdown(result["summary"]))
    print(f"wrote {args.out / 'localization.md'}, .png and .json in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
