"""The instruction-constraint registry: registered checkers, their argument parsers, and the
`Constraint`s built from them.

A checker registers under its instruction id with the `checker` decorator: into `CHECKERS`
(IFEval's, in `checkers`) or `IFBENCH_CHECKERS` (IFBench's, the `ifbench_*` modules, through
`ifbench_text.checker`), with the statement of the constraint (a format string over its
arguments, or a function of them), a parser per argument and an optional check between
arguments. The package imports every checker module, so both registries are full once any of
its modules is imported.

`build_constraint(instruction_id, kwargs)` validates the arguments once and gives a
`Constraint` whose `check(response)` returns a `Verdict` (score 1.0 / 0.0, the verifier
information, the spans). As in IFEval's strict mode, an empty (whitespace-only) response
follows no instruction; `follows_loose(response)` is the loose mode (`loose_variants`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mrtpo.verifiers import Span, Verdict

RELATIONS = ("less than", "at least")


@dataclass(frozen=True)
class Outcome:
    """What one check found: followed or not, why not, and the spans it read."""

    passed: bool
    reason: str
    spans: tuple[Span, ...]


@dataclass(frozen=True)
class CheckerSpec:
    """One registered instruction: `check(text, **args)`, its statement, its argument parsers."""

    check: Callable[..., Outcome]
    statement: str | Callable[..., str]
    arguments: Mapping[str, Callable[[Any], Any]]
    validate: Callable[..., None] | None = None  # checks between arguments; raises ValueError
    # MulDimIF's checkers judge a blank response themselves (some pass it: "at most 150 words");
    # IFEval's and IFBench's strict mode fails it before any check.
    judges_blank: bool = False


# IFEval's instructions, filled by `checkers`; IFBench's, filled by the `ifbench_*` modules
# (the package imports them all); `build_constraint` knows both.
CHECKERS: dict[str, CheckerSpec] = {}
IFBENCH_CHECKERS: dict[str, CheckerSpec] = {}
# MulDimIF's, one per (category, subtype), filled by `muldimif_checkers`.
MULDIMIF_CHECKERS: dict[str, CheckerSpec] = {}


def checker(
    instruction_id: str,
    statement: str | Callable[..., str],
    validate: Callable[..., None] | None = None,
    registry: dict[str, CheckerSpec] = CHECKERS,
    judges_blank: bool = False,
    **arguments: Callable[[Any], Any],
) -> Callable[[Callable[..., Outcome]], Callable[..., Outcome]]:
    """Register `check` under `instruction_id` in `registry`, with its statement and argument
    parsers."""

    def register(check: Callable[..., Outcome]) -> Callable[..., Outcome]:
        if checker_spec(instruction_id) is not None:
            raise ValueError(f"instruction_id {instruction_id!r} is registered twice")
        registry[instruction_id] = CheckerSpec(check, statement, arguments, validate, judges_blank)
        return check

    return register


def checker_spec(instruction_id: str) -> CheckerSpec | None:
    """The registered instruction `instruction_id` (IFEval's, IFBench's or MulDimIF's), or
    None."""
    return (
        CHECKERS.get(instruction_id)
        or IFBENCH_CHECKERS.get(instruction_id)
        or MULDIMIF_CHECKERS.get(instruction_id)
    )


def loose_variants(response: str) -> list[str]:
    """The responses IFEval's and IFBench's loose mode tries (an instruction is followed if
    any non-empty one follows it): the response, without its first line, without its last
    line, without both (these three stripped), and each of the four without asterisks."""
    lines = response.split("\n")
    trimmed = [
        response,
        "\n".join(lines[1:]).strip(),
        "\n".join(lines[:-1]).strip(),
        "\n".join(lines[1:-1]).strip(),
    ]
    return trimmed + [variant.replace("*", "") for variant in trimmed]


@dataclass(frozen=True)
class Constraint:
    """One instruction with validated arguments, ready to check responses."""

    instruction_id: str
    args: dict[str, Any] = field(hash=False)
    statement: str

    def outcome(self, response: str) -> Outcome:
        """What the check finds in `response` (strict mode: an empty response follows nothing,
        except where the checker judges blank responses itself, as MulDimIF's do)."""
        spec = checker_spec(self.instruction_id)
        assert spec is not None, self.instruction_id  # build_constraint checked it
        if not response.strip() and not spec.judges_blank:
            return Outcome(False, "the response is empty", ())
        return spec.check(response, **self.args)

    def check(self, response: str) -> Verdict:
        """Score 1.0 if `response` follows the instruction (strict mode), else 0.0."""
        outcome = self.outcome(response)
        verdict = "satisfied" if outcome.passed else f"not satisfied: {outcome.reason}"
        info = f"Constraint: {self.statement}\nVerdict: {verdict}."
        return Verdict(float(outcome.passed), info, outcome.spans)

    def follows_loose(self, response: str) -> bool:
        """Whether some loose-mode variant of `response` follows the instruction."""
        return any(self.outcome(variant).passed for variant in loose_variants(response))


def build_constraint(instruction_id: str, kwargs: Mapping[str, Any] | None = None) -> Constraint:
    """A `Constraint` for one IFEval or IFBench instruction; None-valued kwargs are dropped
    (the Hugging Face copy of IFEval and IFBench's file list every key, mostly null).
    ValueError on an unknown id, a missing or unexpected argument, or a bad value."""
    spec = checker_spec(instruction_id)
    if spec is None:
        raise ValueError(f"unknown instruction_id {instruction_id!r}")
    given = {name: value for name, value in (kwargs or {}).items() if value is not None}
    unexpected = sorted(set(given) - set(spec.arguments))
    if unexpected:
        raise ValueError(
            f"{instruction_id}: unexpected kwargs {unexpected}; it takes {sorted(spec.arguments)}"
        )
    args = {}
    for name, parse in spec.arguments.items():
        if name not in given:
            raise ValueError(f"{instruction_id}: missing kwarg {name!r}")
        try:
            args[name] = parse(given[name])
        except (TypeError, ValueError) as error:
            raise ValueError(f"{instruction_id}: kwarg {name!r}: {error}") from None
    if spec.validate is not None:
        try:
            spec.validate(**args)
        except ValueError as error:
            raise ValueError(f"{instruction_id}: {error}") from None
    if callable(spec.statement):
        statement = spec.statement(**args)
    else:
        statement = spec.statement.format(**{name: _show(value) for name, value in args.items()})
    return Constraint(instruction_id, args, statement)


# ----------------------------------------------------------------------------------------------
# Argument parsers: return the normalized value (as IFEval normalizes it) or raise ValueError.


def _count(value: Any) -> int:
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole:
        raise ValueError(f"must be a whole number, got {value!r}")
    if value < 0:
        raise ValueError(f"must be >= 0, got {value!r}")
    return int(value)


def _relation(value: Any) -> str:
    if value not in RELATIONS:
        raise ValueError(f"must be one of {RELATIONS}, got {value!r}")
    return value


def _phrase(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value.strip()


def _raw_phrase(value: Any) -> str:
    _phrase(value)
    return value  # IFEval keeps these as given (prompt_to_repeat is stripped when compared)


def _lower_phrase(value: Any) -> str:
    return _phrase(value).lower()


def _words(value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, list | tuple) or not value:
        raise ValueError(f"must be a non-empty list of strings, got {value!r}")
    return [_raw_phrase(word) for word in value]


def _letter(value: Any) -> str:
    if not isinstance(value, str) or len(value) != 1:
        raise ValueError(f"must be a single character, got {value!r}")
    return value.strip().lower()


def _show(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(f'"{word}"' for word in value)
    return str(value)
