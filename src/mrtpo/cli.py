"""The `mrtpo` command: a thin dispatcher to `main(argv)` of the subcommand's module.

Each subcommand lives in its own module (`COMMANDS`: name -> module, help) and parses its own
arguments (TRL's `TrlParser` for the ones that build a trainer). A bad argument raises
`ValueError` (or `FileNotFoundError`): we print one line and exit with code 2, no traceback.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module with `main(argv: list[str]) -> int`, help). Imported by name only when its
# command runs, so `mrtpo eval` never pays for the trainer's imports: the package's one
# importlib use.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "mrtpo.commands.train",
        "train a model with MRTPO, GDPO or GRPO on a task",
    ),
    "eval": (
        "mrtpo.commands.eval",
        "generation on a split or a benchmark (BFCL, Spider, BIRD), then its scoring",
    ),
    "score": (
        "mrtpo.commands.score",
        "eval's scoring on answers made elsewhere (no model loaded)",
    ),
    "sft": (
        "mrtpo.commands.sft",
        "supervised cold start on a task's reference outputs",
    ),
    "explain": (
        "mrtpo.commands.explain",
        "credit map of one response: where each reward's advantage lands",
    ),
    "analyze": (
        "mrtpo.commands.analyze",
        "localization table and concentration figure over a split",
    ),
    "demo": (
        "mrtpo.commands.demo",
        "cold start, MRTPO and a credit map on the embedded model (make demo)",
    ),
}

USAGE = (
    "usage: mrtpo {"
    + ",".join(COMMANDS)
    + "} [options]\n\n"
    + "\n".join(f"  {name:<8} {help_text}" for name, (_, help_text) in COMMANDS.items())
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(USAGE)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"mrtpo: unknown command {name!r}\n{USAGE}", file=sys.stderr)
        return 2
    module_name, _ = COMMANDS[name]
    command = importlib.import_module(module_name)
    try:
        return int(command.main(rest) or 0)
    except (ValueError, FileNotFoundError) as error:
        print(f"mrtpo {name}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
