"""The documentation site's build-time parts: an MkDocs hook (`hooks:` in mkdocs.yml).

- The CLI reference: a page holding `<!-- mrtpo-cli: NAME -->` gets subcommand NAME's options,
  read from the very parser `mrtpo NAME` builds (`cli_markdown`), so an option added to a
  command appears in the site without being written twice.
- The configuration reference: `<!-- mrtpo-config -->` becomes one table per dataclass of
  `MRTPOConfig`'s fields with their types, defaults and help metadata (`config_markdown`), and
  `<!-- mrtpo-train-defaults -->` the defaults `mrtpo train` sets over TRL's.
- `<!-- mrtpo-commands -->`: the subcommands and their one-line help (`mrtpo.cli.COMMANDS`);
  `<!-- mrtpo-recipes -->`: the recipes of recipes/ with what their headers say;
  `<!-- mrtpo-group: PATH -->`: the sampled group of a committed credit map (its group.json).
- Files kept outside docs/ that the site shows as they are (`EXTERNAL`): the benchmark notes
  and their results' tables and figures, under the same paths as in the repository.

The generators are plain functions, tested in tests/test_docs.py without MkDocs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import re
import sys
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The site documents this checkout's code, whatever the environment has installed.
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

# Repository files the site serves at their own paths (globs relative to the repository root).
EXTERNAL = (
    "benchmarks/README.md",
    "benchmarks/results/**/*.md",
    "benchmarks/results/**/*.png",
)
_APPENDED_DEFAULT = re.compile(r"\s*\(default: [^()]*(\([^()]*\)[^()]*)*\)\s*$")
MARKER = re.compile(
    r"<!--\s*mrtpo-(cli|config|train-defaults|commands|recipes|group)(?::\s*([\w./-]+))?\s*-->"
)


# ----------------------------------------------------------------------------- text helpers


def cell(text: Any) -> str:
    """One Markdown table cell: one line, pipes and angle brackets escaped."""
    value = " ".join(str(text).split())
    return value.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def code(text: Any) -> str:
    """Inline code holding `text` (a backtick inside widens the fence)."""
    value = " ".join(str(text).split()).replace("|", "\\|")
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def shown_default(value: Any) -> str:
    """A default as a reader types it (enums by value; none as a dash)."""
    if value is None or value is argparse.SUPPRESS or value is dataclasses.MISSING:
        return "–"
    value = getattr(value, "value", value)  # TRL's and transformers' str enums
    if isinstance(value, str):
        return code(repr(value)) if value == "" else code(value)
    return code(value)


# ----------------------------------------------------------------------------- the CLI


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


@contextmanager
def _parser_capture() -> Iterator[None]:
    """While active, parsing raises `_Captured` with the parser instead of parsing: every
    command (argparse or TRL's `TrlParser`) parses through `parse_known_args`."""
    original = argparse.ArgumentParser.parse_known_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_known_args = capture  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]


def command_module(name: str) -> types.ModuleType:
    """The module of subcommand `name` (`mrtpo.cli.COMMANDS`)."""
    from mrtpo.cli import COMMANDS

    if name not in COMMANDS:
        raise ValueError(f"unknown mrtpo command {name!r}; the commands are {', '.join(COMMANDS)}")
    return importlib.import_module(COMMANDS[name][0])


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser `mrtpo NAME` builds: the command's own `parse_args`, stopped where it parses."""
    module = command_module(name)
    with _parser_capture():
        try:
            module.parse_args([])
        except _Captured as captured:
            return captured.parser
    raise RuntimeError(f"mrtpo {name}: parse_args returned without parsing any argument")


def _class_order(dataclass_types: list[type]) -> list[str]:
    """The classes of the dataclasses' MROs, most derived first, each once."""
    names: list[str] = []
    for dataclass_type in dataclass_types:
        names += [k.__name__ for k in dataclass_type.__mro__ if k.__name__ not in names]
    return names


def _declaring_class(dataclass_types: list[type], dest: str) -> str | None:
    """The name of the dataclass (in the MRO of the parser's dataclasses) that declares `dest`."""
    for dataclass_type in dataclass_types:
        for klass in dataclass_type.__mro__:
            if dest in vars(klass).get("__annotations__", {}):
                return klass.__name__
    return None


def _type_name(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "flag"
    if action.type is None:
        base = "str"
    else:
        base = getattr(action.type, "__name__", str(action.type))
        base = {"string_to_bool": "bool"}.get(base, base)
    if action.nargs in ("+", "*"):
        return f"list of {base}"
    return base


def option_rows(parser: argparse.ArgumentParser) -> list[dict[str, str]]:
    """Every option of `parser` but --help: {"options", "type", "default", "help", "group"}."""
    formatter = parser._get_formatter()
    dataclass_types = list(getattr(parser, "dataclass_types", []))
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        help_text = formatter._expand_help(action) if action.help else ""
        # HfArgumentParser appends the default, which has its own column here.
        help_text = _APPENDED_DEFAULT.sub("", help_text)
        if action.choices:
            choices = ", ".join(str(getattr(c, "value", c)) for c in action.choices)
            help_text = f"{help_text} Choices: {choices}.".strip()
        rows.append(
            {
                "options": ", ".join(code(option) for option in action.option_strings)
                or code(action.dest),
                "type": cell(_type_name(action)),
                "default": "required" if action.required else shown_default(action.default),
                "help": cell(help_text),
                "group": _declaring_class(dataclass_types, action.dest) or "",
            }
        )
    return rows


def _option_table(rows: list[dict[str, str]], indent: str = "") -> str:
    lines = ["| option | type | default | what it does |", "|---|---|---|---|"]
    lines += [f"| {r['options']} | {r['type']} | {r['default']} | {r['help']} |" for r in rows]
    return "\n".join(indent + line for line in lines)


# Where a `TrlParser` command's options come from, in the order a reader needs them; the
# classes of TRL and transformers are shown folded.
_GROUP_TITLES = {
    "TrainArguments": "What to train",
    "SFTArguments": "What to train on",
    "EvalArguments": "What to evaluate",
    "ScoreArguments": "What to score",
    "TaskArguments": "Task, data and model",
    "DataArguments": "Task and data",
    "BenchmarkArguments": "Which part of a benchmark",
    "ColdStartArguments": "Cold-start keys a recipe records (read by `mrtpo sft --config`)",
    "MRTPOConfig": "MRTPO's settings (`MRTPOConfig`)",
}
_FOLDED = ("GRPOConfig", "SFTConfig", "TrainingArguments")


def cli_markdown(name: str) -> str:
    """The reference of `mrtpo NAME`: its description and every option, grouped by the
    dataclass that declares it (TRL's and transformers' groups folded)."""
    parser = command_parser(name)
    rows = option_rows(parser)
    # The command's documentation is its module's docstring.
    parts = [
        inspect.cleandoc(command_module(name).__doc__ or ""),
        f"Usage: `mrtpo {name} [options]`",
    ]
    if "--config" in parser._option_string_actions:
        parts.append(
            "Every option is also a key of a YAML `--config` (a recipe); a flag wins over the "
            "recipe."
        )
    groups: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    if list(groups) == [""]:
        parts.append(_option_table(rows))
        return "\n\n".join(parts) + "\n"
    classes = _class_order(list(getattr(parser, "dataclass_types", [])))
    order = sorted(groups, key=lambda g: (g in _FOLDED, classes.index(g) if g in classes else 99))
    for group in order:
        group_rows = groups[group]
        title = _GROUP_TITLES.get(group, f"`{group}`" if group else "Other options")
        count = f"{len(group_rows)} option" + ("s" if len(group_rows) != 1 else "")
        if group in _FOLDED:
            source = "TRL's" if group != "TrainingArguments" else "transformers'"
            parts.append(
                f'??? info "{source} `{group}`: {count}"\n\n' + _option_table(group_rows, "    ")
            )
        else:
            parts.append(f"### {title}\n\n{count}.\n\n" + _option_table(group_rows))
    return "\n\n".join(parts) + "\n"


def commands_markdown() -> str:
    """The table of subcommands, each linking to its reference page."""
    from mrtpo.cli import COMMANDS

    lines = ["| command | what it does |", "|---|---|"]
    lines += [f"| [`mrtpo {n}`]({n}.md) | {cell(h)} |" for n, (_, h) in COMMANDS.items()]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- MRTPOConfig


def type_text(kind: Any) -> str:
    """A type as a reader says it: `int or None`, `list[float]`, `'a' or 'b'`."""
    if isinstance(kind, str):
        return kind
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        named = [type_text(a) for a in args if a is not type(None)]
        return " or ".join(named + (["None"] if type(None) in args else []))
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in args)
    if origin is not None:
        inner = ", ".join(type_text(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]" if inner else origin.__name__
    return getattr(kind, "__name__", str(kind).replace("typing.", ""))


def _field_default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return shown_default(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return shown_default(field.default_factory())
    return "required"


def config_rows() -> list[dict[str, str]]:
    """Every field of `MRTPOConfig`: {"name", "type", "default", "help", "group"}, the group
    being the class of its MRO that declares the field (MRTPOConfig, GRPOConfig, ...)."""
    from mrtpo.config import MRTPOConfig

    try:
        hints = typing.get_type_hints(MRTPOConfig)
    except (NameError, TypeError):  # a type only named under TYPE_CHECKING: the text it has
        hints = {}
    rows = []
    for field in dataclasses.fields(MRTPOConfig):
        if not field.init:
            continue
        help_text = str(field.metadata.get("help", ""))
        choices = field.metadata.get("choices")
        if choices:
            help_text = f"{help_text} Choices: {', '.join(map(str, choices))}.".strip()
        rows.append(
            {
                "name": code(field.name),
                "type": cell(type_text(hints.get(field.name, field.type))),
                "default": _field_default(field),
                "help": cell(help_text),
                "group": _declaring_class([MRTPOConfig], field.name) or "",
            }
        )
    return rows


def config_markdown() -> str:
    """One table per declaring class: MRTPOConfig's own fields first, then TRL's GRPOConfig's
    and transformers' TrainingArguments' (folded)."""
    rows = config_rows()
    groups: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    parts = []
    for group in sorted(groups, key=lambda g: (g != "MRTPOConfig", list(groups).index(g))):
        group_rows = groups[group]
        lines = ["| field | type | default | what it sets |", "|---|---|---|---|"]
        lines += [
            f"| {r['name']} | {r['type']} | {r['default']} | {r['help']} |" for r in group_rows
        ]
        count = f"{len(group_rows)} fields"
        if group == "MRTPOConfig":
            parts.append(f"## `MRTPOConfig`'s own fields\n\n{count}.\n\n" + "\n".join(lines))
        else:
            source = "transformers'" if group == "TrainingArguments" else "TRL's"
            body = "\n".join("    " + line for line in lines)
            parts.append(f"## {source} `{group}`\n\n" + f'??? info "{count}"\n\n' + body)
    return "\n\n".join(parts) + "\n"


def train_defaults_markdown() -> str:
    """The defaults `mrtpo train` sets over TRL's (`mrtpo.training.CPU_DEFAULTS`)."""
    from mrtpo.config import MRTPOConfig
    from mrtpo.training import CPU_DEFAULTS

    trl_defaults = {f.name: f for f in dataclasses.fields(MRTPOConfig)}
    lines = ["| field | `mrtpo train` | `MRTPOConfig` |", "|---|---|---|"]
    for name, value in CPU_DEFAULTS.items():
        base = _field_default(trl_defaults[name]) if name in trl_defaults else "–"
        lines.append(f"| {code(name)} | {shown_default(value)} | {base} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- recipes, maps


def recipe_summary(path: Path) -> dict[str, str]:
    """A recipe's first sentence (its header comment's) and its task, model and estimator."""
    import yaml

    text = path.read_text(encoding="utf-8")
    lines = []
    for line in text.splitlines():
        if not line.startswith("#") or not line.strip("# "):
            break
        lines.append(line.lstrip("# ").rstrip())
    keys = yaml.safe_load(text) or {}
    header = " ".join(lines)
    first = re.match(r"(.+?\.)(\s|$)", header)
    return {
        "about": first.group(1) if first else header,
        "task": str(keys.get("task", "–")),
        "model": str(keys.get("model_name_or_path", "–")),
        "estimator": str(keys.get("advantage_estimator", "–")),
    }


def recipes_markdown() -> str:
    """The training recipes of recipes/*.yaml, each with what its header says."""
    lines = ["| recipe | task | model | what it is |", "|---|---|---|---|"]
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        about = recipe_summary(path)
        lines.append(
            f"| `recipes/{path.name}` | {code(about['task'])} | {code(about['model'])} "
            f"| {cell(about['about'])} |"
        )
    return "\n".join(lines) + "\n"


def group_markdown(relative: str) -> str:
    """The group of a credit map (`mrtpo explain`'s group.json, path relative to docs/): each
    response with its scores, the explained one first."""
    import json

    group = json.loads((ROOT / "docs" / relative).read_text(encoding="utf-8"))
    names = [
        name for name in group[0]["scores"] if any(m["scores"][name] is not None for m in group)
    ]
    lines = [
        "| response | " + " | ".join(code(n) for n in names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for member in group:
        label = "**explained**: " if member["explained"] else ""
        scores = [member["scores"][name] for name in names]
        shown = ["–" if s is None else f"{s:g}" for s in scores]
        lines.append(f"| {label}{cell(member['completion'])} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- MkDocs events


def expand_markers(markdown: str) -> str:
    """The page's markers replaced by the generated references."""

    def replace(match: re.Match[str]) -> str:
        kind, argument = match.group(1), match.group(2)
        if kind == "cli":
            return cli_markdown(argument or "")
        if kind == "config":
            return config_markdown()
        if kind == "train-defaults":
            return train_defaults_markdown()
        if kind == "recipes":
            return recipes_markdown()
        if kind == "group":
            return group_markdown(argument or "")
        return commands_markdown()

    return MARKER.sub(replace, markdown)


def on_files(files: Any, config: Any) -> Any:
    """Add the repository files of `EXTERNAL` at their own paths."""
    from mkdocs.structure.files import File

    for pattern in EXTERNAL:
        for path in sorted(ROOT.glob(pattern)):
            uri = path.relative_to(ROOT).as_posix()
            if "checkpoints" in path.relative_to(ROOT).parts:
                continue  # git-ignored training output (TRL's model cards) of a study in progress
            if files.get_file_from_path(uri) is None:
                files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand_markers(markdown)
