"""Where the replay distance falls, over many responses: the paper's Table 4 and Figure 6.

Localization (Table 4). For one reward k of one response (an *instance*), let R be the tokens
overlapping the characters its checker read (`Verdict.spans`, mapped to tokens by their
offsets). Then
    Dist. = 100 * sum_{t in R} q_{k,t} / sum_t q_{k,t}   (share of the reward's distance on R)
    Tok.  = 100 * |R| / T                                  (R's share of the response's tokens)
Per reward type and outcome (satisfied: score >= `satisfied_at`, else violated) we report the
**mean over instances** of Dist. and of Tok. (every response counts the same, whatever its
length or total distance), and Ratio = mean Dist. / mean Tok., so the table's Ratio is exactly
its Dist. over its Tok.; 1 is what uniform assignment gives. The JSON also holds the mean of
per-instance ratios. Instances that cannot say anything about localization are left out and
counted as `excluded`: no spans (the checker read no particular characters), spans covering
the whole text (the checker read everything: Ratio ~ 1 whatever the replay does), or zero
total distance.

Concentration (Figure 6). Per reward, averaged over responses: the share of its distance held
by the top p of the response's tokens (k = max(1, ceil(p * T)) tokens, beside the uniform share
k / T), and the share on each part of the response (tags / reasoning / answer / other) beside
the part's share of tokens (what uniform assignment would put there).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mrtpo.credit.map import CreditMap

TOP_FRACTIONS = (0.01, 0.05, 0.10, 0.20)
PARTS = ("tags", "reasoning", "answer", "other")
REASONING_TAGS = frozenset({"think", "thinking", "reasoning"})
_TAG = re.compile(r"</?([A-Za-z][\w-]*)>")


# --- localization ---------------------------------------------------------------------------


def localization_instances(
    maps: Sequence[CreditMap], satisfied_at: float = 1.0
) -> list[dict[str, Any]]:
    """One entry per (response, applicable reward): type, outcome, dist/tok percentages, or
    `excluded` with the reason."""
    instances = []
    for credit_map in maps:
        has_text = np.array([end > start for start, end in credit_map.footprints()], dtype=bool)
        for k, (name, verdict) in enumerate(
            zip(credit_map.types, credit_map.verdicts, strict=True)
        ):
            if verdict.score is None:
                continue
            entry: dict[str, Any] = {
                "type": name,
                "outcome": "satisfied" if verdict.score >= satisfied_at else "violated",
            }
            read = credit_map.tokens_in_spans(verdict.spans)
            distance = credit_map.distance[k]
            total = float(distance.sum())
            if not read.any():
                entry["excluded"] = "no spans"
            elif read[has_text].all():  # the whole text (special tokens stand for none)
                entry["excluded"] = "spans cover the whole response"
            elif total <= 0:
                entry["excluded"] = "zero distance"
            else:
                entry["dist"] = 100.0 * float(distance[read].sum()) / total
                entry["tok"] = 100.0 * float(read.sum()) / credit_map.num_tokens
            instances.append(entry)
    return instances


def _summary_row(
    type_name: str, outcome: str, instances: list[dict[str, Any]], min_instances: int
) -> dict[str, Any]:
    kept = [entry for entry in instances if "excluded" not in entry]
    row: dict[str, Any] = {
        "type": type_name,
        "outcome": outcome,
        "n": len(kept),
        "excluded": len(instances) - len(kept),
        "dist": None,
        "tok": None,
        "ratio": None,
        "mean_instance_ratio": None,
        "enough": len(kept) >= min_instances,
    }
    if kept:
        row["dist"] = float(np.mean([entry["dist"] for entry in kept]))
        row["tok"] = float(np.mean([entry["tok"] for entry in kept]))
        row["ratio"] = row["dist"] / row["tok"]
        row["mean_instance_ratio"] = float(
            np.mean([entry["dist"] / entry["tok"] for entry in kept])
        )
    return row


def localization_table(
    maps: Sequence[CreditMap], satisfied_at: float = 1.0, min_instances: int = 5
) -> list[dict[str, Any]]:
    """Table 4: a row per (reward type `CreditMap.types`, outcome), then the pooled "all" rows (satisfied,
    violated). Each row: type, outcome, n, excluded, dist (%), tok (%), ratio,
    mean_instance_ratio, enough (n >= min_instances; the Markdown shows "–" otherwise)."""
    instances = localization_instances(maps, satisfied_at)
    rows = []
    for type_name in sorted({entry["type"] for entry in instances}):
        for outcome in ("satisfied", "violated"):
            group = [e for e in instances if e["type"] == type_name and e["outcome"] == outcome]
            if group:
                rows.append(_summary_row(type_name, outcome, group, min_instances))
    for outcome in ("satisfied", "violated"):
        group = [e for e in instances if e["outcome"] == outcome]
        rows.append(_summary_row("all", outcome, group, min_instances))
    return rows


def _markdown_text(text: str) -> str:
    return text.replace("|", "\\|")


def _cell(value: float | None, enough: bool, digits: int) -> str:
    return "–" if value is None or not enough else f"{value:.{digits}f}"


def localization_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """Table 4 as Markdown; the pooled rows last, in bold."""
    lines = [
        "| Type | Outcome | Dist. (%) | Tok. (%) | Ratio | n | excl. |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        name = f"**all {row['outcome']}**" if row["type"] == "all" else _markdown_text(row["type"])
        outcome = "" if row["type"] == "all" else row["outcome"]
        lines.append(
            f"| {name} | {outcome} | {_cell(row['dist'], row['enough'], 1)} | {_cell(row['tok'], row['enough'], 1)} "
            f"| {_cell(row['ratio'], row['enough'], 2)} | {row['n']} | {row['excluded']} |"
        )
    return "\n".join(lines) + "\n"


# --- response parts -------------------------------------------------------------------------


def character_parts(text: str) -> list[str]:
    """[len(text)] the part of each character: "tags" (<think>, </answer>, ...), "reasoning"
    (inside <think>...</think>), "answer" (inside any other tag pair) or "other" (outside).

    An opening tag counts only when its closing tag follows (so "<<Title>>" in prose is text);
    a closing tag always counts.
    """
    parts = ["other"] * len(text)
    open_tags: list[str] = []
    position = 0

    def content_part() -> str:
        if any(tag in REASONING_TAGS for tag in open_tags):
            return "reasoning"
        return "answer" if open_tags else "other"

    for match in _TAG.finditer(text):
        name, closing = match.group(1).lower(), match.group(0).startswith("</")
        if not closing and f"</{name}>" not in text[match.end() :].lower():
            continue
        parts[position : match.start()] = [content_part()] * (match.start() - position)
        parts[match.start() : match.end()] = ["tags"] * (match.end() - match.start())
        if not closing:
            open_tags.append(name)
        elif name in open_tags:
            del open_tags[len(open_tags) - 1 - open_tags[::-1].index(name) :]
        position = match.end()
    parts[position:] = [content_part()] * (len(text) - position)
    return parts


def token_parts(credit_map: CreditMap) -> list[str]:
    """[T] the part of each token: the part most of its characters are in ("other" for a
    special token)."""
    characters = character_parts(credit_map.text)
    parts = []
    for start, end in credit_map.footprints():
        counts = {part: characters[start:end].count(part) for part in PARTS}
        parts.append(max(PARTS, key=lambda part: counts[part]) if end > start else "other")
    return parts


# --- concentration --------------------------------------------------------------------------


def _fraction_key(fraction: float) -> str:
    return f"top {fraction * 100:g}%"


def _concentration_of(
    rows: list[tuple[np.ndarray, list[str]]], fractions: Sequence[float]
) -> dict[str, Any]:
    """Mean shares over (distance [T], parts [T]) rows with a positive total."""
    top = {_fraction_key(f): [] for f in fractions}
    top_uniform = {_fraction_key(f): [] for f in fractions}
    part_distance = {part: [] for part in PARTS}
    part_tokens = {part: [] for part in PARTS}
    for distance, parts in rows:
        total, length = float(distance.sum()), len(distance)
        ordered = np.sort(distance)[::-1]
        for fraction in fractions:
            count = max(1, math.ceil(fraction * length))
            top[_fraction_key(fraction)].append(100.0 * float(ordered[:count].sum()) / total)
            top_uniform[_fraction_key(fraction)].append(100.0 * count / length)
        labels = np.array(parts)
        for part in PARTS:
            on_part = labels == part
            part_distance[part].append(100.0 * float(distance[on_part].sum()) / total)
            part_tokens[part].append(100.0 * float(on_part.sum()) / length)

    def mean(values: list[float]) -> float | None:
        return float(np.mean(values)) if values else None

    return {
        "n": len(rows),
        "top": {key: mean(values) for key, values in top.items()},
        "top_uniform": {key: mean(values) for key, values in top_uniform.items()},
        "parts": {part: mean(values) for part, values in part_distance.items()},
        "parts_uniform": {part: mean(values) for part, values in part_tokens.items()},
    }


def concentration(
    maps: Sequence[CreditMap], fractions: Sequence[float] = TOP_FRACTIONS
) -> dict[str, Any]:
    """Figure 6, in percent: per reward type (`CreditMap.types`) and pooled over all rewards ("all"), the mean
    over responses of the top-p shares (`top`, beside `top_uniform`) and of the part shares
    (`parts`, beside `parts_uniform`). Rewards that do not apply (score None) or have zero
    distance on a response are left out for it."""
    for fraction in fractions:
        if not 0 < fraction <= 1:
            raise ValueError(f"fractions must lie in (0, 1], got {fraction}")
    by_reward: dict[str, list[tuple[np.ndarray, list[str]]]] = {}
    for credit_map in maps:
        if credit_map.num_tokens == 0:
            continue
        parts = token_parts(credit_map)
        for k, (name, verdict) in enumerate(
            zip(credit_map.types, credit_map.verdicts, strict=True)
        ):
            if verdict.score is not None and credit_map.distance[k].sum() > 0:
                by_reward.setdefault(name, []).append((credit_map.distance[k], parts))
    pooled = [row for rows in by_reward.values() for row in rows]
    return {
        "fractions": list(fractions),
        "rewards": {
            name: _concentration_of(rows, fractions) for name, rows in sorted(by_reward.items())
        },
        "all": _concentration_of(pooled, fractions),
    }


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def present_parts(result: dict[str, Any]) -> list[str]:
    """The parts that hold any token of the responses (a prose task has only "other")."""
    uniform = result["all"]["parts_uniform"]
    return [part for part in PARTS if (uniform[part] or 0.0) > 0]


def concentration_markdown(result: dict[str, Any]) -> str:
    """Two Markdown tables: top-token shares and part shares, "uniform" rows beside them.
    The parts table is left out when every token is in one part (no tags)."""
    keys = [_fraction_key(f) for f in result["fractions"]]
    entries = [*result["rewards"].items(), ("all rewards", result["all"])]

    def table(columns: list[str], field: str, uniform_field: str, uniform_label: str) -> list[str]:
        lines = [
            "| Reward | n | " + " | ".join(columns) + " |",
            "|---|---:|" + "---:|" * len(columns),
        ]
        for name, entry in entries:
            cells = " | ".join(_percent(entry[field][c]) for c in columns)
            lines.append(f"| {_markdown_text(name)} | {entry['n']} | {cells} |")
        uniform = " | ".join(_percent(result["all"][uniform_field][c]) for c in columns)
        return [*lines, f"| *{uniform_label}* | | {uniform} |"]

    lines = ["Share of each reward's replay distance (%) held by the top tokens of a response.", ""]
    lines += table(keys, "top", "top_uniform", "uniform (GDPO)")
    parts = present_parts(result)
    lines.append("")
    if len(parts) > 1:
        lines += ["Share of each reward's replay distance (%) on each part of the response.", ""]
        lines += table(parts, "parts", "parts_uniform", "uniform (token share)")
    else:
        lines.append(
            f"Every token is in one part of the response ({', '.join(parts) or 'none'}): no part shares."
        )
    return "\n".join(lines) + "\n"


def concentration_png(result: dict[str, Any], path: str | Path, max_rewards: int = 6) -> Path:
    """Bar chart: (a) top-token shares, (b) part shares (when the responses have parts); each
    reward (the `max_rewards` most frequent, plus all rewards pooled) beside the uniform
    assignment in gray."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rewards = sorted(result["rewards"].items(), key=lambda item: -item[1]["n"])[:max_rewards]
    series = [(name, entry) for name, entry in rewards] + [("all rewards", result["all"])]
    panels = [
        (
            [_fraction_key(f) for f in result["fractions"]],
            "top",
            "top_uniform",
            "share held by the top tokens",
        )
    ]
    parts = present_parts(result)
    if len(parts) > 1:
        panels.append((parts, "parts", "parts_uniform", "share on each part of the response"))
    columns = 2 if len(panels) == 1 else 3  # legend columns
    figure, axes_list = plt.subplots(
        1, len(panels), figsize=(5.5 * len(panels) + 3.0, 4.2), squeeze=False
    )
    for number, (axes, (groups, field, uniform_field, title)) in enumerate(
        zip(axes_list[0], panels, strict=True)
    ):
        width = 0.8 / (len(series) + 1)
        positions = np.arange(len(groups))
        for i, (name, entry) in enumerate(series):
            values = [entry[field][g] or 0.0 for g in groups]
            axes.bar(positions + i * width, values, width, label=f"{name} (n={entry['n']})")
        uniform = [result["all"][uniform_field][g] or 0.0 for g in groups]
        axes.bar(
            positions + len(series) * width, uniform, width, color="#999999", label="uniform (GDPO)"
        )
        axes.set_xticks(positions + width * len(series) / 2, groups)
        axes.set_ylabel("% of the reward's replay distance")
        axes.set_ylim(0, 100)
        axes.set_title(f"({'ab'[number]}) {title}", fontsize=10)
    handles, labels = axes_list[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, fontsize=7, loc="lower center", ncol=columns, frameon=False)
    figure.tight_layout(rect=(0, 0.05 + 0.035 * math.ceil(len(labels) / columns), 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=150)
    plt.close(figure)
    return path


def write_json(value: Any, path: str | Path) -> Path:
    """Write `value` as indented JSON (NaN-free: missing numbers are null)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path
