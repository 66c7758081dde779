"""The package's import rules, checked on the source with `ast` (nothing is imported).

The graph has one node per module of `src/mrtpo` (a package is its `__init__`) and one arrow
per import of another module of the package, at module level or inside a function. An import
points at the module it names and nowhere else: `from mrtpo.credit.map import X` is an arrow
to `mrtpo.credit.map` only (Python runs `mrtpo.credit`'s `__init__` first, but that holds for
every submodule and is not a dependency of the importer); `from mrtpo import tasks` is an
arrow to `mrtpo.tasks` because `tasks` is a module; `from mrtpo.credit import X`, with `X` not
a module, is an arrow to `mrtpo.credit`'s `__init__`. So a package `__init__` that re-exports
its submodules is no cycle with them, while a submodule importing names from its own package's
`__init__` is one.

The rules:
(a) no cycles;
(b) the pure math (`mrtpo.advantages`, `mrtpo.auto_beta`, `mrtpo.reward_weighting` and `mrtpo.reward_batch`, what
    both share) imports nothing of the package but itself; `mrtpo.verifiers` imports nothing of
    the package;
(c) `mrtpo.tasks*` imports none of the trainer's modules (`mrtpo.trainer` and its mixins'
    `mrtpo.trainer_metrics`, `mrtpo.trainer_credit`, `mrtpo.trainer_shared_prompt`, which, like
    the trainer, may import `mrtpo.credit`), `mrtpo.credit*`, `mrtpo.commands*`, `mrtpo.cli`;
(d) a module of `mrtpo.commands` imports no other module of `mrtpo.commands`, except the
    package's `__init__` (shared arguments live outside, in `mrtpo.cli_options`);
(e) `importlib` only in `mrtpo.cli` (its lazy subcommand table); elsewhere only
    `importlib.util.find_spec` of an external package and reads of installed wheels' metadata
    (`importlib.metadata.distribution`: how the embedded models' data files are found),
    neither of which imports anything (no `import_module`, no `__import__`).
(f) `mrtpo.credit*` is a library over given ids and tensors: it imports none of the modules
    that generate, replay or load models (`mrtpo.models`, `mrtpo.generation`,
    `mrtpo.relevance`) or run them (`mrtpo.explaining`, the trainer, training, evaluation,
    cold start, the commands), no model library (`transformers`, `trl`, `peft`, `vllm`), and
    calls no `.generate` or `.from_pretrained` on what it is given.

The helpers are tested first on small fake packages written to a temporary folder, each
rule shown failing on one violation; then the rules run on the real tree.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

PACKAGE = "mrtpo"
SRC = Path(__file__).resolve().parents[1] / "src"

Graph = dict[str, dict[str, int]]  # module -> {imported module: first line of the import}

# The trainer and the modules of the mixins it inherits: rules (c) and (f) treat them as one.
TRAINER = (
    "mrtpo.trainer",
    "mrtpo.trainer_metrics",
    "mrtpo.trainer_credit",
    "mrtpo.trainer_shared_prompt",
    "mrtpo.trainer_beta_auto",
    "mrtpo.trainer_loss_options",
)
# Rule (b): the pure-math modules, which may import each other and nothing else of the package.
MATH = ("mrtpo.advantages", "mrtpo.auto_beta", "mrtpo.reward_weighting", "mrtpo.reward_batch")
# Rule (d): the modules of mrtpo.commands that the others may import.
COMMANDS_SHARED = ("mrtpo.commands",)
# Rule (e): what a module other than the dispatcher may use of importlib.
IMPORTLIB_ALLOWED = {
    "importlib.util.find_spec",
    "importlib.metadata.distribution",
    "importlib.metadata.PackageNotFoundError",
}
IMPORTLIB_MODULE = "mrtpo.cli"
# Rule (f): what mrtpo.credit may not import, of the package and outside it, nor call.
CREDIT_FORBIDDEN = (
    "mrtpo.models",
    "mrtpo.generation",
    "mrtpo.relevance",
    "mrtpo.explaining",
    *TRAINER,
    "mrtpo.training",
    "mrtpo.evaluation",
    "mrtpo.cold_start",
    "mrtpo.commands",
    "mrtpo.cli",
)
MODEL_LIBRARIES = ("transformers", "trl", "peft", "vllm")
MODEL_CALLS = frozenset({"generate", "from_pretrained"})


# ----------------------------------------------------------------------------- helpers


def within(module: str, *packages: str) -> bool:
    """Whether `module` is one of `packages` or inside one of them."""
    return any(module == package or module.startswith(package + ".") for package in packages)


def find_modules(src: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of `package` under `src`, by dotted name (a package by its own name)."""
    modules = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    if package not in modules:
        raise ValueError(f"{src / package} has no __init__.py: not a package folder")
    return modules


def _known(name: str, modules: set[str]) -> str:
    """`name` if it is a module, else its longest prefix that is (a missing module's package)."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def imported_modules(
    module: str, is_package: bool, tree: ast.Module, modules: set[str], package: str = PACKAGE
) -> dict[str, int]:
    """The package's modules that `module` imports anywhere in `tree`, with each first line.

    Args:
        module: the importing module's dotted name.
        is_package: whether it is a package's `__init__` (relative imports start there).
        tree: its parsed source.
        modules: every module name of the package.
        package: the top-level package name.
    """
    targets: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        target = _known(name, modules)
        if within(target, package) and target != module:
            targets.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                add(submodule if submodule in modules else base, node.lineno)
    return targets


def import_graph(src: Path, package: str = PACKAGE) -> Graph:
    """The arrows between the modules of `package` under `src`."""
    modules = find_modules(src, package)
    return {
        name: imported_modules(
            name,
            path.name == "__init__.py",
            ast.parse(path.read_text(encoding="utf-8"), filename=str(path)),
            set(modules),
            package,
        )
        for name, path in modules.items()
    }


def cycles(graph: Graph) -> list[list[str]]:
    """Cycles found by a depth-first search (one per back arrow), each as [a, b, ..., a].

    Empty if and only if the graph has no cycle.
    """
    found: list[list[str]] = []
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        path.append(module)
        for target in sorted(graph.get(module, {})):
            if target in path:
                found.append([*path[path.index(target) :], target])
            elif target not in done:
                visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module)
    return found


def forbidden_arrows(
    graph: Graph, source: Callable[[str], bool], target: Callable[[str], bool]
) -> list[str]:
    """Every arrow from a module `source` accepts to a module `target` accepts, as text."""
    return [
        f"{module} imports {imported} (line {line})"
        for module, arrows in sorted(graph.items())
        if source(module)
        for imported, line in sorted(arrows.items())
        if target(imported)
    ]


def isolated_violations(graph: Graph) -> list[str]:
    """Rule (b): the pure math imports only itself, the verifier contract nothing of the package."""
    return forbidden_arrows(
        graph,
        lambda module: module in MATH,
        lambda imported: within(imported, PACKAGE) and imported not in MATH,
    ) + forbidden_arrows(
        graph,
        lambda module: module == "mrtpo.verifiers",
        lambda imported: within(imported, PACKAGE),
    )


def tasks_violations(graph: Graph) -> list[str]:
    """Rule (c): tasks stay below the trainer, the credit maps and the commands."""
    return forbidden_arrows(
        graph,
        lambda module: within(module, "mrtpo.tasks"),
        lambda imported: within(imported, *TRAINER, "mrtpo.credit", "mrtpo.commands", "mrtpo.cli"),
    )


def commands_violations(graph: Graph) -> list[str]:
    """Rule (d): commands share code through other modules, not through each other."""
    return forbidden_arrows(
        graph,
        lambda module: within(module, "mrtpo.commands"),
        lambda imported: within(imported, "mrtpo.commands") and imported not in COMMANDS_SHARED,
    )


def importlib_uses(tree: ast.Module) -> list[tuple[str, int]]:
    """Every use of `importlib` (or `__import__`) in `tree`: (dotted name used, line).

    Attribute chains are followed through the names `import importlib[.x] [as y]` and
    `from importlib[.x] import y` bind, so `importlib.util.find_spec(...)` is
    "importlib.util.find_spec"; a `find_spec` call on a string literal of the package itself
    is reported as "importlib.util.find_spec(<literal>)".
    """
    bound: dict[str, str] = {}  # local name -> the importlib name it stands for
    uses: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if within(alias.name, "importlib"):
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound["importlib"] = "importlib"
        elif isinstance(node, ast.ImportFrom) and within(node.module or "", "importlib"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                bound[alias.asname or alias.name] = full
                uses.append((full, node.lineno))

    def dotted(node: ast.expr) -> str | None:
        """The importlib name an attribute chain stands for, or None."""
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    class Uses(ast.NodeVisitor):
        def visit_Attribute(self, node: ast.Attribute) -> None:
            name = dotted(node)
            if name is None:
                self.generic_visit(node)
            else:  # the longest chain only: not again for its `value`
                uses.append((name, node.lineno))

        def visit_Name(self, node: ast.Name) -> None:
            if node.id == "__import__":
                uses.append(("__import__", node.lineno))
            elif node.id in bound and not bound[node.id].startswith("importlib.util.find_spec"):
                uses.append((bound[node.id], node.lineno))

        def visit_Call(self, node: ast.Call) -> None:
            if dotted(node.func) == "importlib.util.find_spec" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and within(str(first.value), PACKAGE):
                    uses.append((f"importlib.util.find_spec({first.value!r})", node.lineno))
            self.generic_visit(node)

    Uses().visit(tree)
    return uses


def importlib_violations(src: Path, package: str = PACKAGE) -> list[str]:
    """Rule (e): importlib only in the dispatcher; elsewhere only find_spec of other packages."""
    violations = []
    for module, path in find_modules(src, package).items():
        if module == IMPORTLIB_MODULE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        violations += [
            f"{module} uses {name} (line {line})"
            for name, line in importlib_uses(tree)
            if name not in IMPORTLIB_ALLOWED
        ]
    return violations


def credit_violations(graph: Graph) -> list[str]:
    """Rule (f), inside the package: credit maps are built from what the model runs hand over."""
    return forbidden_arrows(
        graph,
        lambda module: within(module, "mrtpo.credit"),
        lambda imported: within(imported, *CREDIT_FORBIDDEN),
    )


def model_library_uses(tree: ast.Module) -> list[tuple[str, int]]:
    """Every import of a model library in `tree` ("transformers", "trl.GRPOTrainer", ...) and
    every `.generate` / `.from_pretrained` attribute (".generate"), with its line."""
    uses: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            uses += [
                (alias.name, node.lineno)
                for alias in node.names
                if within(alias.name, *MODEL_LIBRARIES)
            ]
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and within(node.module or "", *MODEL_LIBRARIES)
        ):
            uses += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
        elif isinstance(node, ast.Attribute) and node.attr in MODEL_CALLS:
            uses.append((f".{node.attr}", node.lineno))
    return uses


def credit_model_violations(src: Path, package: str = PACKAGE) -> list[str]:
    """Rule (f), outside the package: no model library in credit, no generating, no loading."""
    violations = []
    for module, path in find_modules(src, package).items():
        if within(module, f"{package}.credit"):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            violations += [
                f"{module} uses {name} (line {line})" for name, line in model_library_uses(tree)
            ]
    return violations


# ----------------------------------------------------------------------------- fake packages


def write_package(root: Path, files: dict[str, str]) -> Path:
    """Write `files` ({path relative to root: source}) and return `root` (the src folder)."""
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return root


# A tiny tree that follows every rule: packages re-export submodules, the commands' shared
# arguments outside commands/, find_spec of an external package, importlib.import_module in
# the dispatcher.
CLEAN = {
    "mrtpo/__init__.py": "",
    "mrtpo/advantages.py": "import torch\n\nfrom mrtpo import reward_weighting\n",
    "mrtpo/reward_weighting.py": "from mrtpo.reward_batch import check_rewards\n",
    "mrtpo/reward_batch.py": "import torch\n",
    "mrtpo/verifiers.py": "from dataclasses import dataclass\n",
    "mrtpo/models.py": "import importlib.util\n\nSPEC = importlib.util.find_spec('gguf')\n",
    "mrtpo/generation.py": "from mrtpo import models\n",
    "mrtpo/relevance/__init__.py": "import torch\n",
    "mrtpo/trainer.py": "from mrtpo import advantages\nfrom mrtpo.credit import write_maps\n",
    "mrtpo/cli.py": "import importlib\n\n\ndef main(name):\n"
    "    return importlib.import_module(f'mrtpo.commands.{name}')\n",
    "mrtpo/tasks/__init__.py": "from mrtpo.tasks.base import Task\n\n\ndef get():\n"
    "    from mrtpo.tasks.sql import TASK\n    return TASK\n",
    "mrtpo/tasks/base.py": "from mrtpo.verifiers import dataclass\n",
    "mrtpo/tasks/sql/__init__.py": "from .task import TASK\n",
    "mrtpo/tasks/sql/task.py": "from mrtpo.tasks.base import Task\nfrom . import sandbox\n"
    "TASK = Task()\n",
    "mrtpo/tasks/sql/sandbox.py": "import sqlite3\n",
    "mrtpo/credit/__init__.py": "from mrtpo.credit.map import CreditMap\n"
    "from mrtpo.credit.render import write_maps\n",
    "mrtpo/credit/map.py": "from mrtpo.verifiers import dataclass\n",
    "mrtpo/credit/render.py": "from mrtpo.credit.map import CreditMap\n",
    "mrtpo/commands/__init__.py": '"""Subcommands."""\n',
    "mrtpo/cli_options.py": "import argparse\n",
    "mrtpo/commands/train.py": "from mrtpo.cli_options import argparse\n\n\ndef main():\n"
    "    from mrtpo import tasks, trainer\n",
    "mrtpo/commands/eval.py": "from mrtpo import cli_options, commands\n",
}


def fake_tree(tmp_path: Path, **changes: str) -> Path:
    """The CLEAN tree with some files replaced (keyword: path with '/' as '__', '.py' dropped)."""
    files = dict(CLEAN)
    for key, source in changes.items():
        files[key.replace("__", "/") + ".py"] = source
    return write_package(tmp_path, files)


def test_arrows_resolve_to_the_module_named(tmp_path):
    graph = import_graph(fake_tree(tmp_path))
    assert graph["mrtpo.trainer"] == {"mrtpo.advantages": 1, "mrtpo.credit": 2}
    assert graph["mrtpo.credit.render"] == {"mrtpo.credit.map": 1}  # not mrtpo.credit
    assert graph["mrtpo.tasks"] == {"mrtpo.tasks.base": 1, "mrtpo.tasks.sql": 5}  # in a function
    assert graph["mrtpo.tasks.sql"] == {"mrtpo.tasks.sql.task": 1}  # relative, from a package
    assert graph["mrtpo.tasks.sql.task"] == {"mrtpo.tasks.base": 1, "mrtpo.tasks.sql.sandbox": 2}
    assert graph["mrtpo.commands.train"] == {
        "mrtpo.cli_options": 1,
        "mrtpo.tasks": 5,
        "mrtpo.trainer": 5,
    }
    assert graph["mrtpo.advantages"] == {"mrtpo.reward_weighting": 3}
    assert graph["mrtpo.reward_batch"] == {}  # torch is not the package


def test_import_of_a_package_is_its_init(tmp_path):
    src = fake_tree(tmp_path, mrtpo__models="import mrtpo.tasks.sql\nimport mrtpo.tasks.nowhere\n")
    assert import_graph(src)["mrtpo.models"] == {"mrtpo.tasks.sql": 1, "mrtpo.tasks": 2}


def test_the_clean_tree_follows_every_rule(tmp_path):
    src = fake_tree(tmp_path)
    graph = import_graph(src)
    assert cycles(graph) == []  # mrtpo.credit re-exports mrtpo.credit.map: no cycle
    assert isolated_violations(graph) == []
    assert tasks_violations(graph) == []
    assert commands_violations(graph) == []
    assert importlib_violations(src) == []
    assert credit_violations(graph) == []
    assert credit_model_violations(src) == []


def test_a_cycle_is_reported_with_its_path(tmp_path):
    graph = import_graph(
        fake_tree(
            tmp_path,
            mrtpo__advantages="from mrtpo import models\n",
            mrtpo__models="def load():\n    from mrtpo import trainer\n",
        )
    )
    assert cycles(graph) == [
        ["mrtpo.advantages", "mrtpo.models", "mrtpo.trainer", "mrtpo.advantages"]
    ]


def test_a_submodule_importing_its_own_package_is_a_cycle(tmp_path):
    graph = import_graph(
        fake_tree(tmp_path, mrtpo__credit__render="from mrtpo.credit import CreditMap\n")
    )
    assert cycles(graph) == [["mrtpo.credit", "mrtpo.credit.render", "mrtpo.credit"]]


def test_isolated_modules_fail_on_any_package_import(tmp_path):
    graph = import_graph(
        fake_tree(tmp_path, mrtpo__verifiers="def f():\n    from mrtpo.tasks import base\n")
    )
    assert isolated_violations(graph) == ["mrtpo.verifiers imports mrtpo.tasks.base (line 2)"]
    # The math may import the math (the clean tree's advantages does), and nothing else.
    graph = import_graph(
        fake_tree(tmp_path, mrtpo__reward_batch="from mrtpo.verifiers import dataclass\n")
    )
    assert isolated_violations(graph) == ["mrtpo.reward_batch imports mrtpo.verifiers (line 1)"]
    graph = import_graph(fake_tree(tmp_path, mrtpo__verifiers="from mrtpo import reward_batch\n"))
    assert isolated_violations(graph) == ["mrtpo.verifiers imports mrtpo.reward_batch (line 1)"]


def test_tasks_fail_on_importing_credit(tmp_path):
    graph = import_graph(
        fake_tree(tmp_path, mrtpo__tasks__sql__sandbox="from mrtpo.credit.map import CreditMap\n")
    )
    assert tasks_violations(graph) == ["mrtpo.tasks.sql.sandbox imports mrtpo.credit.map (line 1)"]


@pytest.mark.parametrize("module", ["mrtpo.trainer", "mrtpo.trainer_credit"])
def test_tasks_fail_on_importing_the_trainer_or_its_mixins(tmp_path, module):
    # The mixins' modules are not inside `mrtpo.trainer` (no dot): named one by one.
    files = {"mrtpo__trainer_credit": "from mrtpo.credit import CreditMap\n"}
    graph = import_graph(
        fake_tree(tmp_path, **files, mrtpo__tasks__sql__sandbox=f"import {module}\n")
    )
    assert tasks_violations(graph) == [f"mrtpo.tasks.sql.sandbox imports {module} (line 1)"]
    assert graph["mrtpo.trainer_credit"] == {"mrtpo.credit": 1}  # as the trainer may


def test_commands_fail_on_importing_each_other(tmp_path):
    graph = import_graph(
        fake_tree(tmp_path, mrtpo__commands__train="from mrtpo.commands import eval as evaluate\n")
    )
    assert commands_violations(graph) == [
        "mrtpo.commands.train imports mrtpo.commands.eval (line 1)"
    ]


def test_commands_fail_on_a_shared_module_inside_commands(tmp_path):
    src = write_package(tmp_path, {**CLEAN, "mrtpo/commands/common.py": "import argparse\n"})
    (src / "mrtpo/commands/train.py").write_text("from mrtpo.commands.common import argparse\n")
    assert commands_violations(import_graph(src)) == [
        "mrtpo.commands.train imports mrtpo.commands.common (line 1)"
    ]


@pytest.mark.parametrize(
    ("source", "imported"),
    [
        ("from mrtpo.models import load_model\n", "mrtpo.models (line 1)"),
        ("def f():\n    from mrtpo import generation\n", "mrtpo.generation (line 2)"),
        ("import mrtpo.relevance\n", "mrtpo.relevance (line 1)"),
    ],
)
def test_credit_fails_on_importing_what_runs_models(tmp_path, source, imported):
    graph = import_graph(fake_tree(tmp_path, mrtpo__credit__render=source))
    assert credit_violations(graph) == [f"mrtpo.credit.render imports {imported}"]


@pytest.mark.parametrize(
    ("source", "used"),
    [
        ("import transformers\n", "transformers (line 1)"),
        (
            "def load(name):\n    from transformers import AutoModelForCausalLM\n",
            "transformers.AutoModelForCausalLM (line 2)",
        ),
        ("from trl.trainer import GRPOTrainer\n", "trl.trainer.GRPOTrainer (line 1)"),
        ("def answer(model, ids):\n    return model.generate(ids)\n", ".generate (line 2)"),
        ("def load(cls):\n    return cls.from_pretrained('x')\n", ".from_pretrained (line 2)"),
    ],
)
def test_credit_fails_on_model_libraries_and_calls(tmp_path, source, used):
    src = fake_tree(tmp_path, mrtpo__credit__map=source)
    assert credit_model_violations(src) == [f"mrtpo.credit.map uses {used}"]
    assert credit_model_violations(fake_tree(tmp_path / "clean")) == []


@pytest.mark.parametrize(
    ("source", "used"),
    [
        ("import importlib\nm = importlib.import_module('json')\n", "importlib.import_module"),
        ("from importlib import import_module\n", "importlib.import_module"),
        (
            "import importlib.util as u\nu.spec_from_file_location\n",
            "importlib.util.spec_from_file_location",
        ),
        ("json = __import__('json')\n", "__import__"),
        (
            "from importlib.util import find_spec\nfind_spec('mrtpo.tasks')\n",
            "importlib.util.find_spec('mrtpo.tasks')",
        ),
    ],
)
def test_importlib_fails_outside_the_dispatcher(tmp_path, source, used):
    src = fake_tree(tmp_path, mrtpo__models=source)
    assert [v.split(" (line")[0] for v in importlib_violations(src)] == [
        f"mrtpo.models uses {used}"
    ]


# ----------------------------------------------------------------------------- the real tree


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph(SRC)


def test_the_modules_the_rules_name_exist(graph):
    for module in (*MATH, "mrtpo.verifiers", *TRAINER, "mrtpo.cli"):
        assert module in graph, f"{module} is missing: the import rules would check nothing"
    for package in ("mrtpo.tasks", "mrtpo.credit", "mrtpo.commands"):
        assert any(within(module, package) and module != package for module in graph), package


def test_no_import_cycles(graph):
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_math_and_verifiers_import_nothing_else_of_the_package(graph):
    assert not (found := isolated_violations(graph)), "\n".join(found)


def test_tasks_import_no_trainer_credit_or_commands(graph):
    assert not (found := tasks_violations(graph)), "\n".join(found)


def test_commands_do_not_import_each_other(graph):
    assert not (found := commands_violations(graph)), "\n".join(found)


def test_importlib_only_in_the_dispatcher_and_for_find_spec():
    assert not (found := importlib_violations(SRC)), "\n".join(found)


def test_credit_imports_nothing_that_runs_models(graph):
    assert not (found := credit_violations(graph)), "\n".join(found)


def test_credit_uses_no_model_library_and_calls_no_generate():
    assert not (found := credit_model_violations(SRC)), "\n".join(found)
