"""The documentation site: its generated references hold every CLI option and every config
field, and the whole site builds with `mkdocs build --strict` (skipped without MkDocs)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import docs_site
import pytest

from mrtpo.cli import COMMANDS
from mrtpo.config import MRTPOConfig

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", list(COMMANDS))
def test_cli_reference_lists_every_option_of_the_commands_parser(name):
    parser = docs_site.command_parser(name)
    page = docs_site.cli_markdown(name)
    options = [
        option
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        for option in action.option_strings
    ]
    assert options, f"mrtpo {name} has no option"
    missing = [option for option in options if f"`{option}`" not in page]
    assert not missing
    rows = re.findall(r"^\s*\| `--", page, flags=re.M)  # one row per action, aliases together
    assert len(rows) == len(options) - _aliases(parser)


def _aliases(parser: argparse.ArgumentParser) -> int:
    """Options beyond the first of each action (one table row per action)."""
    return sum(
        len(a.option_strings) - 1
        for a in parser._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction)
    )


def test_cli_reference_groups_train_options_by_their_dataclass():
    page = docs_site.cli_markdown("train")
    ours = page.index("### MRTPO's settings (`MRTPOConfig`)")
    assert page.index("### What to train") < ours < page.index("TRL's `GRPOConfig`")
    mrtpo_row = next(line for line in page.splitlines() if line.startswith("| `--mrtpo_beta`"))
    assert "| float or 'auto' | `auto` |" in mrtpo_row and "beta in [0, 1]" in mrtpo_row
    # mrtpo train's own CPU defaults, as its parser sets them, not TRL's.
    steps_row = next(
        line for line in page.splitlines() if line.lstrip().startswith("| `--max_steps`")
    )
    assert "| `8` |" in steps_row
    assert "(default:" not in page  # HfArgumentParser's appended default has its own column


def test_cli_reference_of_an_argparse_command():
    page = docs_site.cli_markdown("explain")
    row = next(line for line in page.splitlines() if line.startswith("| `--task`"))
    assert row == "| `--task` | str | required | sql, tool_calling or instructions |"
    assert "`mrtpo explain`: the credit map of one response" in page  # the module's docstring


def test_config_reference_lists_every_field_once():
    page = docs_site.config_markdown()
    fields = [f.name for f in dataclasses.fields(MRTPOConfig) if f.init]
    rows = re.findall(r"^\s*\| `(\w+)` \|", page, flags=re.M)
    assert sorted(rows) == sorted(fields)
    own = page[page.index("`MRTPOConfig`'s own fields") : page.index("TRL's `GRPOConfig`")]
    for name in ("advantage_estimator", "mrtpo_beta", "reward_weighting", "replay_mode"):
        assert f"| `{name}` |" in own
    estimator = next(line for line in own.splitlines() if "| `advantage_estimator` |" in line)
    assert "Choices: mrtpo, gdpo, grpo." in estimator
    shifts = next(line for line in own.splitlines() if "| `saw_reward_shifts` |" in line)
    assert "| list[float] or None | – |" in shifts


def test_train_defaults_table_is_mrtpo_trains():
    from mrtpo.training import CPU_DEFAULTS

    table = docs_site.train_defaults_markdown()
    assert len(table.strip().splitlines()) == 2 + len(CPU_DEFAULTS)
    assert "| `max_steps` | `8` | `-1` |" in table


def test_markers_expand_and_unknown_text_stays():
    text = "before\n<!-- mrtpo-commands -->\nafter <!-- not ours -->"
    expanded = docs_site.expand_markers(text)
    assert "| [`mrtpo train`](train.md) |" in expanded
    assert expanded.startswith("before\n") and expanded.endswith("after <!-- not ours -->")


def test_group_table_of_a_committed_map():
    table = docs_site.group_markdown("credit-maps/instructions-19/group.json")
    lines = table.strip().splitlines()
    assert lines[0] == "| response | `constraint_0` | `constraint_1` |"
    assert len(lines) == 2 + 5  # the explained response and the 4 sampled with it
    assert lines[2].startswith("| **explained**: A dog walker is") and lines[2].endswith(
        "| 1 | 0 |"
    )


def _nav_pages(entry) -> list[str]:
    if isinstance(entry, str):
        return [entry] if entry.endswith(".md") else []
    values = entry.values() if isinstance(entry, dict) else entry
    return [page for value in values for page in _nav_pages(value)]


def test_every_page_of_the_nav_exists_and_every_page_is_in_the_nav():
    import yaml

    in_nav = set(_nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    served = set(in_nav)
    # The hook serves these repository files at their own paths (globbed as the hook globs them:
    # Path.match's "**" spans one folder only before Python 3.13).
    external = {
        path.relative_to(ROOT).as_posix()
        for pattern in docs_site.EXTERNAL
        for path in ROOT.glob(pattern)
    }
    served -= external
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert served - pages == set(), "a nav entry has no page"
    assert pages - in_nav == set(), "a page is missing from the nav"


def test_readme_links_resolve():
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e .[docs])")
    pytest.importorskip("material", reason="mkdocs-material is not installed (the docs extra)")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed (the docs extra)")
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")}
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    train = (site / "reference" / "cli" / "train" / "index.html").read_text()
    assert "--mrtpo_beta" in train and "--reward_weighting" in train
    api = (site / "reference" / "api" / "advantages" / "index.html").read_text()
    assert 'id="mrtpo.advantages.gdpo"' in api  # mkdocstrings rendered the docstrings
    guide = (site / "guides" / "custom-task" / "index.html").read_text()
    assert "class AnswerCorrect" in re.sub(r"<[^>]+>", "", guide)  # the snippet was included
    assert (site / "credit-maps" / "instructions-19" / "credit.html").is_file()
    assert (site / "benchmarks" / "results" / "localization" / "localization.png").is_file()


# Commands that read a YAML recipe with `--config` before their parser runs (TrlParser's way).
_RECIPE_COMMANDS = {"train", "sft"}
_WRITTEN_COMMANDS = [
    ROOT / "README.md",
    ROOT / "benchmarks" / "README.md",
    ROOT / "Makefile",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "recipes").rglob("*.yaml")),
    *sorted((ROOT / "benchmarks").glob("*.sh")),
    *sorted((ROOT / "scripts").glob("*.sh")),
    *sorted((ROOT / "src" / "mrtpo").rglob("*.py")),
]


def _written_mrtpo_commands(text: str) -> list[tuple[str, list[str]]]:
    """Every `mrtpo NAME ...` written in `text`: the command and the options it passes. A shell
    line continuation joins its lines; `&&`, `;`, `|`, `)`, a comment or a backtick ends it."""
    text = re.sub(r"\\\n\s*", " ", text)
    found = []
    for match in re.finditer(rf"\bmrtpo ({'|'.join(COMMANDS)})\b([^`\n#;|&)]*)", text):
        flags = re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", match.group(2))
        found.append((match.group(1), flags))
    return found


# Spellings a parser still accepts for an option that every command spells another way.
_OLD_SPELLINGS = {"--out": "--output_dir"}


def test_every_command_spells_its_output_folder_output_dir():
    """One spelling for one thing: every command takes `--output_dir` (and `--output-dir`);
    `mrtpo explain` and `mrtpo analyze` keep their first spelling, `--out`, as an alias of it."""
    for name in COMMANDS:
        actions = {
            option: action
            for action in docs_site.command_parser(name)._actions
            for option in action.option_strings
        }
        assert {"--output_dir", "--output-dir"} <= set(actions), name
        assert actions["--output_dir"] is actions["--output-dir"]
        if name in ("explain", "analyze"):
            assert actions["--out"] is actions["--output_dir"]
            parsed = docs_site.command_parser(name).parse_args(["--task", "sql", "--out", "x"])
            assert parsed.output_dir == "x"


def test_written_commands_parse_the_way_they_are_written():
    """A command copied from the README, the docs, a recipe's comment, a benchmark script or a
    docstring only passes options its parser has, each in the spelling every command uses."""
    options = {
        name: {o for a in docs_site.command_parser(name)._actions for o in a.option_strings}
        for name in COMMANDS
    }
    for name in _RECIPE_COMMANDS:
        options[name].add("--config")
    unknown, old, seen = [], [], 0
    for path in _WRITTEN_COMMANDS:
        for name, flags in _written_mrtpo_commands(path.read_text()):
            seen += 1
            where = f"{path.relative_to(ROOT)}: mrtpo {name}"
            unknown += [f"{where} {flag}" for flag in flags if flag not in options[name]]
            old += [f"{where} {f} ({_OLD_SPELLINGS[f]})" for f in flags if f in _OLD_SPELLINGS]
    assert seen > 50  # the scan finds the commands (README, docs, recipes, embedded_models.sh)
    assert not unknown, "options the command does not have:\n" + "\n".join(unknown)
    assert not old, "an old spelling, where every command spells it otherwise:\n" + "\n".join(old)


def test_written_command_scan_catches_a_wrong_option():
    text = "run `mrtpo train --task sql --mrtpo-beta 0.5` then\nmrtpo eval --task sql \\\n  --nope 1 && mrtpo sft --x"
    assert _written_mrtpo_commands(text) == [
        ("train", ["--task", "--mrtpo-beta"]),
        ("eval", ["--task", "--nope"]),
        ("sft", ["--x"]),
    ]
