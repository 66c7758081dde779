"""Text-to-SQL datasets: the bundled shop data, Spider and BIRD folders.

Every loader returns a `datasets.Dataset` with the columns the trainer and the verifiers read:
`prompt` (system prompt + an instruction holding the schema and the question), `db_path`,
`reference_sql`, `db_id`, `question`, plus the source's own fields (nested ones as JSON text).
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from datasets import Dataset

from mrtpo.tasks.sql.sandbox import read_schema

BUNDLED_DIR = Path(__file__).resolve().parents[2] / "data" / "sql"
BUNDLED_SPLITS = ("train", "test")

SYSTEM_PROMPT = (
    "You translate questions into SQLite queries. You may think first inside "
    "<think>...</think>. Then write exactly one SQL query inside <answer>...</answer> "
    "and nothing after it."
)

SPIDER_SPLITS = {"dev": "dev.json", "train": "train_spider.json"}
BIRD_SPLITS = ("dev", "train")


def instruction(schema: str, question: str, evidence: str | None = None) -> str:
    """The user turn: the schema, optional evidence (BIRD's hint) and the question."""
    hint = f"Evidence: {evidence.strip()}\n" if evidence and evidence.strip() else ""
    return f"Database schema:\n{schema}\n\n{hint}Question: {question.strip()}\nWrite one SQLite query that answers the question."


def _arrow_friendly(value: Any) -> Any:
    """Source fields as Arrow can store them: nested structures become JSON text."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return json.dumps(value, ensure_ascii=False)


def _rows(
    examples: list[Mapping[str, Any]],
    db_paths: list[Path],
    reference_key: str,
    system_prompt: str,
    evidence_key: str | None = None,
) -> Dataset:
    schemas: dict[Path, str] = {}
    rows = []
    for example, db_path in zip(examples, db_paths, strict=True):
        if db_path not in schemas:
            schemas[db_path] = read_schema(db_path)
        evidence = example.get(evidence_key) if evidence_key else None
        user = instruction(schemas[db_path], str(example["question"]), evidence)
        row = {
            "prompt": [
                {"role": "system", "content": system_prompt},
                {"role": "user", "content": user},
            ],
            "db_path": str(db_path),
            "reference_sql": str(example[reference_key]),
            "db_id": str(example["db_id"]),
            "question": str(example["question"]),
        }
        for key, value in example.items():
            row.setdefault(key, _arrow_friendly(value))
        rows.append(row)
    return Dataset.from_list(rows)


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise ValueError(f"missing file: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error


def _check_examples(examples: Any, path: Path, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    if not isinstance(examples, list):
        raise ValueError(f"{path} must hold a JSON list of examples")
    for i, example in enumerate(examples):
        missing = [k for k in keys if not isinstance(example, dict) or k not in example]
        if missing:
            raise ValueError(f"{path}: example {i} lacks {', '.join(missing)}")
    return examples


def _resolve_databases(
    examples: list[dict[str, Any]],
    db_path_of: Any,
    skip_missing: bool,
    source: str,
) -> tuple[list[dict[str, Any]], list[Path]]:
    """Keep the examples whose database file exists; error (or warn and skip) otherwise."""
    paths = [db_path_of(example["db_id"]) for example in examples]
    missing = Counter(str(p) for p in paths if not p.is_file())
    if missing and not skip_missing:
        listed = "; ".join(f"{p} ({n} examples)" for p, n in sorted(missing.items()))
        raise ValueError(
            f"{source}: database file missing: {listed}. Pass skip_missing=True to skip those examples."
        )
    if missing:
        warnings.warn(
            f"{source}: skipped {sum(missing.values())} examples whose database file is missing: "
            + "; ".join(f"{p} ({n})" for p, n in sorted(missing.items())),
            stacklevel=3,
        )
    kept = [(e, p) for e, p in zip(examples, paths, strict=True) if p.is_file()]
    if not kept:
        raise ValueError(f"{source}: no example has its database file")
    return [e for e, _ in kept], [p for _, p in kept]


def _spider_examples(root: Path, split: str) -> tuple[list[dict[str, Any]], Path, Any]:
    """(examples, their file, db_id -> database path) of Spider's `split` at `root`."""
    split = "dev" if split == "test" else split
    if split not in SPIDER_SPLITS:
        raise ValueError(f"split must be one of {sorted(SPIDER_SPLITS)} for Spider, got {split!r}")
    examples_path = root / SPIDER_SPLITS[split]
    examples = _check_examples(
        _read_json(examples_path), examples_path, ("db_id", "question", "query")
    )
    tables_path = root / "tables.json"
    tables = _read_json(tables_path)
    known = (
        {t.get("db_id") for t in tables if isinstance(t, dict)}
        if isinstance(tables, list)
        else set()
    )
    unknown = sorted({e["db_id"] for e in examples} - known)
    if unknown:
        raise ValueError(
            f"{examples_path}: db_id(s) not described in {tables_path}: {', '.join(unknown)}"
        )
    return examples, examples_path, lambda db_id: root / "database" / db_id / f"{db_id}.sqlite"


def load_spider(
    root: str | Path,
    split: str = "dev",
    skip_missing: bool = False,
    system_prompt: str = SYSTEM_PROMPT,
) -> Dataset:
    """Spider at `root`: `dev.json` or `train_spider.json`, `tables.json`,
    `database/<db_id>/<db_id>.sqlite`; examples have `db_id`, `question`, `query`.

    split: "dev" or "train" ("test" reads dev.json: the public dev set is Spider's usual test set).
    skip_missing: skip (with a warning giving the count) examples whose database file is absent
    instead of raising ValueError.
    """
    examples, examples_path, db_path_of = _spider_examples(Path(root), split)
    examples, db_paths = _resolve_databases(examples, db_path_of, skip_missing, str(examples_path))
    return _rows(examples, db_paths, "query", system_prompt)


def _bird_split_dir(root: Path, split: str) -> Path:
    """BIRD's split folder: `root/<split>/` (the archive's layout) or `root` itself."""
    if (root / split / f"{split}.json").is_file():
        return root / split
    if (root / f"{split}.json").is_file():
        return root
    raise ValueError(
        f"missing file: {root / split / f'{split}.json'} (nor {root / f'{split}.json'})"
    )


def _bird_examples(root: Path, split: str) -> tuple[list[dict[str, Any]], Path, Any]:
    """(examples, their file, db_id -> database path) of BIRD's `split` at `root`."""
    split = "dev" if split == "test" else split
    if split not in BIRD_SPLITS:
        raise ValueError(f"split must be one of {list(BIRD_SPLITS)} for BIRD, got {split!r}")
    folder = _bird_split_dir(root, split)
    examples_path = folder / f"{split}.json"
    examples = _check_examples(
        _read_json(examples_path), examples_path, ("db_id", "question", "SQL")
    )
    databases = folder / f"{split}_databases"
    if not databases.is_dir():
        raise ValueError(f"missing folder: {databases}")
    return examples, examples_path, lambda db_id: databases / db_id / f"{db_id}.sqlite"


def load_bird(
    root: str | Path,
    split: str = "dev",
    skip_missing: bool = False,
    system_prompt: str = SYSTEM_PROMPT,
) -> Dataset:
    """BIRD at `root`: `dev/dev.json` (question_id, db_id, question, evidence, SQL, difficulty)
    and `dev/dev_databases/<db_id>/<db_id>.sqlite` (or the same inside `root` itself); the
    evidence goes into the prompt.

    split: "dev" or "train" ("test" reads dev: BIRD's test set is not public).
    skip_missing: as in `load_spider`.
    """
    examples, examples_path, db_path_of = _bird_examples(Path(root), split)
    examples, db_paths = _resolve_databases(examples, db_path_of, skip_missing, str(examples_path))
    return _rows(examples, db_paths, "SQL", system_prompt, evidence_key="evidence")


def is_bird(root: Path) -> bool:
    return any(
        (root / s / f"{s}.json").is_file() or (root / f"{s}_databases").is_dir()
        for s in BIRD_SPLITS
    )


def is_spider(root: Path) -> bool:
    return (root / "tables.json").is_file() or (root / "database").is_dir()


def benchmark_name(root: Path) -> str | None:
    """ "bird" or "spider" by the folder's layout (None for neither)."""
    if not root.is_dir():
        return None
    if is_bird(root):
        return "bird"
    if is_spider(root):
        return "spider"
    return None


def load_path(path: str | Path, split: str = "dev", **kwargs: Any) -> Dataset:
    """Spider or BIRD at `path`, chosen by the folder's layout."""
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"path must be a Spider or BIRD folder, got {root} (not a folder)")
    name = benchmark_name(root)
    if name == "bird":
        return load_bird(root, split, **kwargs)
    if name == "spider":
        return load_spider(root, split, **kwargs)
    raise ValueError(
        f"{root} has neither Spider's layout (tables.json, database/<db_id>/<db_id>.sqlite) "
        "nor BIRD's (dev/dev.json, dev/dev_databases/<db_id>/<db_id>.sqlite)"
    )


def load_benchmark_rows(
    path: str | Path,
    split: str = "dev",
    max_examples: int | None = None,
    system_prompt: str = SYSTEM_PROMPT,
) -> tuple[str, Dataset, Counter[str]]:
    """(benchmark name, rows, examples skipped by db_id) of the Spider or BIRD folder at
    `path`: its first `max_examples` examples (all when None), those whose database file is
    missing left out and counted. Each row gets `id` (its 0-based position in the examples
    file, the line of Spider's and BIRD's prediction files) and `benchmark`."""
    root = Path(path)
    name = benchmark_name(root)
    if name is None:
        raise ValueError(f"{root} is neither a Spider nor a BIRD folder")
    read = _bird_examples if name == "bird" else _spider_examples
    examples, examples_path, db_path_of = read(root, split)
    examples = [
        {**example, "id": str(index), "benchmark": name}
        for index, example in enumerate(examples[:max_examples])
    ]
    kept, skipped = [], Counter()
    for example in examples:
        if db_path_of(example["db_id"]).is_file():
            kept.append(example)
        else:
            skipped[example["db_id"]] += 1
    if not kept:
        raise ValueError(f"{examples_path}: no example has its database file")
    rows = _rows(
        kept,
        [db_path_of(example["db_id"]) for example in kept],
        "SQL" if name == "bird" else "query",
        system_prompt,
        evidence_key="evidence" if name == "bird" else None,
    )
    return name, rows, skipped


def load_bundled(split: str = "train", system_prompt: str = SYSTEM_PROMPT) -> Dataset:
    """The bundled shop data: split "train" or "test" (fixed; see scripts/build_data/sql.py)."""
    if split not in BUNDLED_SPLITS:
        raise ValueError(f"split must be one of {list(BUNDLED_SPLITS)}, got {split!r}")
    path = BUNDLED_DIR / f"{split}.jsonl"
    if not path.is_file():
        raise ValueError(f"missing file: {path} (run `python scripts/build_data/sql.py`)")
    examples = [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    examples, db_paths = _resolve_databases(
        examples, lambda db_id: BUNDLED_DIR / f"{db_id}.sqlite", False, str(path)
    )
    return _rows(examples, db_paths, "query", system_prompt)
