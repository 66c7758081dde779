"""Read IFEval-shaped JSONL files (IFEval, IFBench, the bundled data) into a `datasets.Dataset`.

A file has one JSON object per line: `key`, `prompt` (the instruction text), `instruction_id_list`
and `kwargs` (a list of dicts aligned with the ids). Two kwargs layouts are accepted: Google's
(each dict holds only the keys its instruction uses) and the Hugging Face copy's (every key of
every instruction present, mostly null): null values are dropped, as IFEval's harness does.

Dataset columns:
- `prompt`: chat messages `[{"role": "system", ...}, {"role": "user", "content": <prompt>}]`;
- `key`: the row's key (int64 when every key is an integer, else string);
- `instruction_id_list`: list of strings;
- `kwargs`: list of JSON strings, one per instruction. The kwargs dicts of different
  instructions have different keys; stored as dicts, Arrow would merge them into one struct
  and fill every missing key with null. JSON strings keep each dict as it is; the verifiers
  parse them (`decode_kwargs`).
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from datasets import Dataset, Features, Value

from mrtpo.tasks.instructions.registry import build_constraint, checker_spec

SYSTEM_PROMPT = "You are a helpful assistant. Follow every instruction in the request exactly."


def encode_kwargs(kwargs: Sequence[dict[str, Any] | None]) -> list[str]:
    """One JSON string per instruction, nulls dropped (the `kwargs` column)."""
    return [json.dumps(_drop_nulls(entry), sort_keys=True, ensure_ascii=False) for entry in kwargs]


def decode_kwargs(value: Any, n_instructions: int) -> list[dict[str, Any]]:
    """The kwargs dicts of one row, from the `kwargs` column: a list of JSON strings (ours), a
    JSON string of the whole list, or a list of dicts (IFEval's own rows)."""
    if isinstance(value, str):
        value = json.loads(value)
    if value is None:
        value = [{}] * n_instructions
    if not isinstance(value, list | tuple) or len(value) != n_instructions:
        raise ValueError(
            f"kwargs must hold {n_instructions} entries, one per instruction, got {value!r}"
        )
    return [_drop_nulls(json.loads(entry) if isinstance(entry, str) else entry) for entry in value]


def _drop_nulls(entry: Any) -> dict[str, Any]:
    if entry is None:
        return {}
    if not isinstance(entry, dict):
        raise ValueError(f"each kwargs entry must be a dict, got {entry!r}")
    return {name: value for name, value in entry.items() if value is not None}


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file (blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path {str(path)!r} is not a file")
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number}: not JSON ({error})") from None
    return rows


def load_ifeval(
    path: str | Path, skip_unknown: bool = False, system_prompt: str = SYSTEM_PROMPT
) -> Dataset:
    """An IFEval- or IFBench-shaped JSONL file as a Dataset (columns in the module docstring);
    the instruction ids of both benchmarks are known, and a file may mix them.

    Every instruction is built into a checker here, so bad kwargs fail at load time. Unknown
    instruction ids raise a ValueError listing them, or with `skip_unknown=True` are dropped
    with a warning (and so are rows left with no instruction).
    """
    rows = read_jsonl(path)
    unknown: Counter[str] = Counter()
    records = []
    for index, row in enumerate(rows):
        key = row.get("key", index)
        prompt, ids = row.get("prompt"), row.get("instruction_id_list")
        if not isinstance(prompt, str):
            raise ValueError(f"{path}: row key={key!r}: prompt must be a string, got {prompt!r}")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError(
                f"{path}: row key={key!r}: instruction_id_list must be a list of strings"
            )
        try:
            kwargs = decode_kwargs(row.get("kwargs"), len(ids))
        except ValueError as error:
            raise ValueError(f"{path}: row key={key!r}: {error}") from None
        known = [(i, k) for i, k in zip(ids, kwargs, strict=True) if checker_spec(i) is not None]
        unknown.update(i for i in ids if checker_spec(i) is None)
        for instruction_id, instruction_kwargs in known:
            try:
                build_constraint(instruction_id, instruction_kwargs)
            except ValueError as error:
                raise ValueError(f"{path}: row key={key!r}: {error}") from None
        if known:
            records.append((key, prompt, known))
    if unknown:
        listing = ", ".join(f"{i} ({n})" for i, n in sorted(unknown.items()))
        if not skip_unknown:
            raise ValueError(
                f"{path}: {len(unknown)} unknown instruction ids: {listing}; "
                "pass skip_unknown=True to drop them"
            )
        warnings.warn(
            f"{path}: skipped {sum(unknown.values())} instructions with unknown ids ({listing}); "
            f"kept {len(records)} of {len(rows)} rows",
            stacklevel=2,
        )
    integer_keys = all(isinstance(key, int) and not isinstance(key, bool) for key, _, _ in records)
    features = Features(
        {
            "prompt": [{"role": Value("string"), "content": Value("string")}],
            "key": Value("int64" if integer_keys else "string"),
            "instruction_id_list": [Value("string")],
            "kwargs": [Value("string")],
        }
    )
    columns: dict[str, list[Any]] = {name: [] for name in features}
    for key, prompt, known in records:
        columns["prompt"].append(
            [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]
        )
        columns["key"].append(key if integer_keys else str(key))
        columns["instruction_id_list"].append([i for i, _ in known])
        columns["kwargs"].append(encode_kwargs([k for _, k in known]))
    return Dataset.from_dict(columns, features=features)


def load_ifbench(path: str | Path, system_prompt: str = SYSTEM_PROMPT) -> Dataset:
    """IFBench's test file (`IFBench_test.jsonl`, IFEval's layout) as a Dataset, every
    instruction checked at load time: `load_ifeval` with no unknown id allowed."""
    return load_ifeval(path, skip_unknown=False, system_prompt=system_prompt)
