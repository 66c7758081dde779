"""Training outputs that need no tracker: `metrics.jsonl` and `curves.png` in `output_dir`.

`metrics.jsonl` has one JSON object per log call (every step with MRTPO's default
`logging_steps=1`): `{"step": N, <every logged value>}`. `curves.png` plots each reward's mean
(`rewards/<name>/mean`) over steps, one line per reward, with a second panel for the reward
weights when they change per step (SAW: `mrtpo/reward_weight/<name>`), and is rewritten at every
log so it can be watched while training runs. A resumed run keeps the lines up to its checkpoint's step and
drops the later ones (they belong to the run being replaced).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from transformers import TrainerCallback

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
REWARD_PREFIX, REWARD_SUFFIX = "rewards/", "/mean"
REWARD_WEIGHT_PREFIX = "mrtpo/reward_weight/"  # + reward name: the step's c_k (SAW)


def _jsonable(value: Any) -> Any:
    """JSON has no NaN or infinity: those become null; tensors and numpy scalars become floats."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


def reward_curves(
    records: list[dict[str, Any]], prefix: str = REWARD_PREFIX, suffix: str = REWARD_SUFFIX
) -> dict[str, tuple[list[int], list[float]]]:
    """{reward name: (steps, values)} of the keys `<prefix><name><suffix>` in metrics records
    (by default each reward's mean), skipping missing values."""
    curves: dict[str, tuple[list[int], list[float]]] = {}
    for record in records:
        for key, value in record.items():
            if key.startswith(prefix) and key.endswith(suffix) and value is not None:
                name = key[len(prefix) : len(key) - len(suffix)]
                steps, values = curves.setdefault(name, ([], []))
                steps.append(record["step"])
                values.append(float(value))
    return curves


def _plot_panel(
    axes: Any, curves: dict[str, tuple[list[int], list[float]]], ylabel: str, title: str
) -> None:
    """One line per reward over steps."""
    for name, (steps, values) in curves.items():
        axes.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=name)
    axes.set_xlabel("step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")


def plot_reward_curves(records: list[dict[str, Any]], path: str | Path) -> bool:
    """Draw each reward's mean over steps into a PNG at `path`, and below it each reward's
    weight when the records have per-step weights (SAW); False when there is nothing yet.

    The figure is written to a temporary file and moved into place, so a viewer never reads a
    half-written image.
    """
    curves = reward_curves(records)
    if not curves:
        return False
    weights = reward_curves(records, REWARD_WEIGHT_PREFIX, "")
    # No pyplot: no global state, no GUI backend.
    figure = Figure(figsize=(7, 7 if weights else 4), dpi=100)
    _plot_panel(
        figure.add_subplot(2 if weights else 1, 1, 1),
        curves,
        "mean reward",
        "Reward means over training",
    )
    if weights:
        _plot_panel(figure.add_subplot(2, 1, 2), weights, "weight c_k", "Reward weights (SAW)")
    figure.tight_layout()
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    figure.savefig(temporary, format="png")
    os.replace(temporary, path)
    return True


class MetricsFileCallback(TrainerCallback):
    """Appends every log to `output_dir/metrics.jsonl` and redraws `output_dir/curves.png`.

    Only the main process writes.
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] | None = None

    def _start(self, args: Any, state: Any) -> None:
        """Keep earlier lines up to the current step (a resumed run), drop the rest."""
        self.records = []
        path = Path(args.output_dir) / METRICS_FILE
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by a crash
                    continue
                if isinstance(record, dict) and record.get("step", math.inf) <= state.global_step:
                    self.records.append(record)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(record) + "\n" for record in self.records))

    def on_step_begin(self, args, state, control, **kwargs):
        # The first step of a run: the checkpoint (if any) is loaded, so global_step is known.
        if self.records is None and state.is_world_process_zero:
            self._start(args, state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if self.records is None:
            self._start(args, state)
        record = {"step": state.global_step}
        record.update({key: _jsonable(value) for key, value in logs.items()})
        self.records.append(record)
        with open(Path(args.output_dir) / METRICS_FILE, "a") as file:
            file.write(json.dumps(record) + "\n")
        plot_reward_curves(self.records, Path(args.output_dir) / CURVES_FILE)
