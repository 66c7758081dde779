"""Training outputs that need no tracker: `metrics.jsonl` and `curves.png` in `output_dir`.

`metrics.jsonl` has one JSON object per log call (every step with MRTPO's default
`logging_steps=1`): `{"step": N, <every logged value>}`. `curves.png` plots each reward's mean
(`rewards/<name>/mean`) over steps, one line per reward, and is rewritten at every log so it can
be watched while training runs. A resumed run keeps the lines up to its checkpoint's step and
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


def _jsonable(value: Any) -> Any:
    """JSON has no NaN or infinity: those become null; tensors and numpy scalars become floats."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


def reward_curves(records: list[dict[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """{reward name: (steps, mean rewards)} from metrics records, skipping missing values."""
    curves: dict[str, tuple[list[int], list[float]]] = {}
    for record in records:
        for key, value in record.items():
            if key.startswith(REWARD_PREFIX) and key.endswith(REWARD_SUFFIX) and value is not None:
                name = key[len(REWARD_PREFIX) : -len(REWARD_SUFFIX)]
                steps, values = curves.setdefault(name, ([], []))
                steps.append(record["step"])
                values.append(float(value))
    return curves


def plot_reward_curves(records: list[dict[str, Any]], path: str | Path) -> bool:
    """Draw each reward's mean over steps into a PNG at `path`; False when there is nothing yet.

    The figure is written to a temporary file and moved into place, so a viewer never reads a
    half-written image.
    """
    curves = reward_curves(records)
    if not curves:
        return False
    figure = Figure(figsize=(7, 4), dpi=100)  # no pyplot: no global state, no GUI backend
    axes = figure.add_subplot()
    for name, (steps, values) in curves.items():
        axes.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=name)
    axes.set_xlabel("step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("mean reward")
    axes.set_title("Reward means over training")
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")
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
