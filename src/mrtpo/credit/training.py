"""What the trainer writes every `credit_map_steps` steps: one HTML page of credit maps per
step and an index of all steps written so far."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mrtpo.credit.map import CreditMap
from mrtpo.credit.render import index_html, to_html


def _mean_scores(maps: Sequence[CreditMap]) -> dict[str, float]:
    """Each reward's mean score over the maps (rows where it applies)."""
    totals: dict[str, list[float]] = {}
    for credit_map in maps:
        for name, verdict in zip(credit_map.names, credit_map.verdicts, strict=True):
            if verdict.score is not None:
                totals.setdefault(name, []).append(verdict.score)
    return {name: float(np.mean(scores)) for name, scores in totals.items()}


def _storable(value: float | None) -> float | str | None:
    """A diagnostic as strict JSON holds it: NaN as None, an infinity as "inf" or "-inf"."""
    if value is None or math.isnan(value):
        return None
    return float(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def write_training_maps(
    output_dir: str | Path,
    step: int,
    records: Sequence[CreditMap | Mapping[str, Any]],
    diagnostics: Mapping[str, float | None] | None = None,
) -> Path:
    """Write the credit maps of a few training rows; (re)write the index of all steps.

    Writes `output_dir/credit/step-XXXXX.html` (one section per row) and
    `output_dir/credit/index.html` (every step written so far, its link, each reward's mean
    score over its rows and the step's diagnostics; the steps are remembered in
    `output_dir/credit/index.json`). Returns the path of the step's page.

    diagnostics: optional figures of the whole step, shown above its maps and as columns of the
    index, e.g. {"beta": 0.3, "reallocation_ratio": 0.41, "agreement": 0.012}; None or NaN
    shows as "–" (what the trainer passes: `mrtpo.trainer_credit`).

    Each record is a `CreditMap` (what the trainer passes) or a dict for one row of the batch:
      prompt: str, or the chat messages (the last message's content is shown);
      completion_ids: [T] the response token ids (may be right-padded, see mask);
      tokenizer: the processing class that decodes them (offsets come from it);
        or, instead of these two, tokens: [T] the token strings, concatenating to the text;
      mask: optional [T] 1 on response tokens, 0 on padding;
      text: optional, the completion text the verifiers read (default: the decoded ids);
      names: [K] reward names;
      distance: [K, T] replay distances q_{k,t};
      weights: [K, T] MRTPO weights w_{k,t};
      reward_advantages: [K] per-reward advantages Ã_k of this row;
      token_advantages: [T] combined per-token advantage A_t;
      verdicts: [K] Verdict(score, info, spans);
      gdpo_advantage: optional float, GDPO's advantage of this row;
      reward_weights: optional [K] reward weights c_k;
      types: optional [K] each reward's kind of check (see `CreditMap.types`);
      replayed: optional [K] bool, whether each reward was replayed (default: all were);
      title: optional heading (e.g. "lowest reward").
    Arrays may be lists, numpy arrays or torch tensors.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    maps = [r if isinstance(r, CreditMap) else CreditMap.from_record(r) for r in records]
    credit_dir = Path(output_dir) / "credit"
    credit_dir.mkdir(parents=True, exist_ok=True)
    page = credit_dir / f"step-{step:05d}.html"
    figures = {name: _storable(value) for name, value in (diagnostics or {}).items()}
    page_html = to_html(maps, title=f"Credit maps, step {step}", diagnostics=figures)
    page.write_text(page_html, encoding="utf-8")

    index_json = credit_dir / "index.json"
    steps = json.loads(index_json.read_text(encoding="utf-8")) if index_json.exists() else []
    steps = [entry for entry in steps if entry["step"] != step]
    entry = {"step": step, "page": page.name, "rows": len(maps), "rewards": _mean_scores(maps)}
    steps.append({**entry, "diagnostics": figures})
    steps.sort(key=lambda entry: entry["step"])
    index_json.write_text(json.dumps(steps, indent=1), encoding="utf-8")

    (credit_dir / "index.html").write_text(index_html(steps), encoding="utf-8")
    return page
