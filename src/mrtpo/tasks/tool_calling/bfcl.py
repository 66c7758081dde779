"""BFCL's AST-checker rules for Python function calls, with partial credit.

The rules are those of `bfcl_eval/eval_checker/ast_eval/ast_checker.py` (BFCL v4, Python
language), written anew here (the project does not import bfcl_eval's code):

- the function name must match exactly;
- every parameter the schema marks required must be given;
- every given parameter must be in the schema *and* in the possible answer;
- a possible answer's parameter that is not given must allow `""` (optional);
- a given value must pass the type check and then be one of the allowed values:
  strings are compared after `standardize_string` (lower case; spaces and `,./-_*^` removed;
  `'` read as `"`); lists compare element by element in order (string elements standardized);
  dicts compare key by key (string values standardized, int == float by Python equality);
  lists of dicts compare dict by dict in order;
- an int is accepted for a float parameter at the top level (converted) and inside dicts
  (Python's 1 == 1.0), but not as an element of a list of floats (the nested type check);
- the type check treats a value of the allowed values' own type as a "variable" (BFCL's
  answers sometimes hold a variable name as a string) and then compares it plainly;
- parallel calls: as many calls as references; each reference, in order, takes the first
  not yet taken call that is valid for it (order-independent, greedy like BFCL; so a
  response can fail although another assignment would fit, exactly as in BFCL).

Scoring adds partial credit on top: one unit per reference function name and one per reference
parameter; a unit is right when that part passes the rule above. Parameters the reference does
not name, required parameters missing outside the reference, and surplus calls are wrong
units added to the total. So a call scores 1.0 exactly when every rule holds, i.e. exactly
when BFCL's checker says valid.

Schemas are read in either BFCL's type names ("dict", "float", "tuple", "any") or JSON
Schema's ("object", "number", "array"): both map to the same Python types. Cases where BFCL's
own code would crash (an unknown type, a schema-less reference function) get a defined answer
here: an unknown type skips the type check, a missing schema means no parameters are known.

`language` "java" or "javascript" (BFCL's `simple_java` and `simple_javascript`): every value
must be a string, read into a Python value by the declared Java/JavaScript type
(`bfcl_languages`), then checked by the same rules without the int -> float conversion.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mrtpo.tasks.tool_calling.bfcl_languages import (
    JAVA_ARRAYS,
    JAVA_TYPES,
    JAVASCRIPT_ARRAYS,
    JAVASCRIPT_TYPES,
    declared_types,
    java_literal,
    java_value,
    javascript_literal,
    javascript_value,
)

# Declared type -> the Python type json.loads gives for it.
PYTHON_TYPES: dict[str, type] = {
    "string": str,
    "any": str,
    "integer": int,
    "float": float,
    "number": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "object": dict,
}
ARRAY_TYPES = ("array", "tuple")
FLOAT_TYPES = ("float", "number")
LANGUAGES = ("python", "java", "javascript")
# language -> (declared type -> Python type, declared types whose items are typed)
_TYPE_TABLES: dict[str, tuple[dict[str, type], tuple[str, ...]]] = {
    "python": (PYTHON_TYPES, ARRAY_TYPES),
    "java": (JAVA_TYPES, JAVA_ARRAYS),
    "javascript": (JAVASCRIPT_TYPES, JAVASCRIPT_ARRAYS),
}

_IGNORED_IN_STRINGS = re.compile(r"[ \,\./\-_\*\^]")


def standardize_string(text: str) -> str:
    """BFCL's string normalization: drop spaces and `,./-_*^`, lower case, `'` -> `"`."""
    return _IGNORED_IN_STRINGS.sub("", text).lower().replace("'", '"')


def _standardized(value: Any) -> Any:
    return standardize_string(value) if type(value) is str else value


def _as_list(allowed: Any) -> list[Any]:
    """Allowed values as a list (BFCL's data always has lists; anything else is wrapped)."""
    return allowed if isinstance(allowed, list) else [allowed]


def _first_answer_type(allowed: list[Any]) -> type | None:
    """The type of the first allowed value other than "" (None if every value is "")."""
    for answer in allowed:
        if not (type(answer) is str and answer == ""):
            return type(answer)
    return None


def _type_check(
    value: Any, allowed: list[Any], expected: type, nested: type | None
) -> tuple[bool, bool]:
    """(passes, is_variable): BFCL's type_checker, nested check one level deep."""
    answer_type = _first_answer_type(allowed)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for option in allowed:
            # A non-list option (such as "") lets any element types through, as in BFCL.
            if type(option) is not list or all(
                _type_check(element, option, nested, None)[0] for element in value
            ):
                return True, is_variable
        return False, is_variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, is_variable


def _string_matches(value: str, allowed: list[Any]) -> bool:
    return standardize_string(value) in [standardize_string(a) for a in allowed if type(a) is str]


def _list_matches(value: list[Any], allowed: list[Any]) -> bool:
    options = [
        [_standardized(element) for element in option]
        for option in allowed
        if type(option) in (list, str)
    ]
    return [_standardized(element) for element in value] in options


def _key_answers(answers: Any) -> list[Any]:
    """A dict key's allowed values as BFCL walks them: a list's elements, a string's characters
    (a malformed answer such as {"format": "epoch_millis"} is compared character by character,
    as BFCL's checker does), anything else alone."""
    return list(answers) if isinstance(answers, list | str) else [answers]


def _dict_matches(value: dict[str, Any], allowed: list[Any]) -> bool:
    """BFCL's dict_checker: some allowed dict accepts every key of `value` and misses none
    that is not optional ("" among its allowed values; in a string, "" is always found)."""
    for option in allowed:
        if type(option) is not dict:  # "" (optional) and malformed options never match
            continue
        keys_ok = all(
            key in option
            and _standardized(element) in [_standardized(a) for a in _key_answers(option[key])]
            for key, element in value.items()
        )
        if keys_ok and all(
            key in value or (isinstance(answers, list | str) and "" in answers)
            for key, answers in option.items()
        ):
            return True
    return False


def _list_of_dicts_matches(value: list[Any], allowed: list[Any]) -> bool:
    """BFCL's list_dict_checker: same length as an allowed list, each dict matching in order."""
    for option in allowed:
        if type(option) not in (list, str) or len(option) != len(value):
            continue
        if all(
            type(element) is dict and _dict_matches(element, [expected])
            for element, expected in zip(value, option, strict=True)
        ):
            return True
    return False


def python_types(
    param_schema: Mapping[str, Any], language: str = "python"
) -> tuple[type | None, type | None]:
    """(expected, nested): the Python type of a parameter's value in `language` and, for
    arrays, of its elements (None where the declared type is unknown or not an array)."""
    if language not in _TYPE_TABLES:
        raise ValueError(f"language must be one of {LANGUAGES}, got {language!r}")
    table, arrays = _TYPE_TABLES[language]
    declared, item_type = declared_types(param_schema)
    expected = table.get(declared) if isinstance(declared, str) else None
    nested = None
    if declared in arrays:
        nested = table.get(item_type) if isinstance(item_type, str) else None
    return expected, nested


def _converted(value: Any, param_schema: Mapping[str, Any], language: str) -> Any:
    """The value BFCL checks: Java/JavaScript strings read by their declared type; Python's
    int accepted for a float (converted)."""
    declared, item_type = declared_types(param_schema)
    if language == "java" and declared in JAVA_TYPES:
        return java_value(value, declared, item_type)
    if language == "javascript" and declared in JAVASCRIPT_TYPES:
        return javascript_value(value, declared, item_type)
    if language == "python" and declared in FLOAT_TYPES and type(value) is int:
        return float(value)  # Python's int -> float conversion, as BFCL allows
    return value


def argument_is_valid(
    value: Any, allowed: Any, param_schema: Mapping[str, Any], language: str = "python"
) -> bool:
    """Whether one given argument value passes BFCL's checks for its allowed values
    (`language`: "python", "java" or "javascript")."""
    allowed = _as_list(allowed)
    expected, nested = python_types(param_schema, language)
    if language != "python" and type(value) is not str:
        return False  # Java and JavaScript values are given as strings
    try:
        value = _converted(value, param_schema, language)
    except OverflowError:  # an int too large for a float
        return False
    if expected is None:  # unknown declared type: plain comparison
        return value in allowed
    passes, is_variable = _type_check(value, allowed, expected, nested)
    if not passes:
        return False
    if not is_variable:
        if expected is dict:
            return _dict_matches(value, allowed)
        if expected is list and nested is dict:
            return _list_of_dicts_matches(value, allowed)
        if expected is str:
            return _string_matches(value, allowed)
        if expected is list:
            return _list_matches(value, allowed)
    return value in allowed


def _first_allowed(allowed: Any) -> tuple[bool, Any]:
    """(found, value): the first allowed value other than "" (found False when there is none)."""
    for value in _as_list(allowed):
        if not (type(value) is str and value == ""):
            return True, value
    return False, None


def _value_from_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A dict value from an answer's dict spec {key: [allowed]}: first allowed of each key."""
    value = {}
    for key, allowed in spec.items():
        found, chosen = _first_allowed(allowed)
        if found:
            value[key] = chosen
    return value


def _literal(value: Any, param_schema: Mapping[str, Any], language: str) -> Any:
    """A Java/JavaScript value written as the string BFCL reads back (Python: the value);
    the value itself when the type has no literal for it (the call then fails, as in BFCL)."""
    if language == "python":
        return value
    declared, item_type = declared_types(param_schema)
    write = java_literal if language == "java" else javascript_literal
    text = write(value, declared, item_type) if isinstance(declared, str) else None
    return value if text is None else text


def _argument_from(answer: Any, schema: Mapping[str, Any], language: str) -> Any:
    """The argument standing for one allowed answer: a dict parameter's answer is itself a
    spec {key: [allowed]} (a list-of-dicts parameter's, a list of specs), as BFCL's dict
    checker reads it, so those are built key by key; Java and JavaScript values are written
    as the literal string BFCL reads back (`bfcl_languages`)."""
    expected, nested = python_types(schema, language)
    if expected is dict and type(answer) is dict:
        answer = _value_from_spec(answer)
    elif expected is list and nested is dict and type(answer) is list:
        answer = [_value_from_spec(spec) if type(spec) is dict else spec for spec in answer]
    return _literal(answer, schema, language)


def reference_arguments(
    function_schema: Mapping[str, Any] | None,
    params: Mapping[str, Any],
    language: str = "python",
) -> dict[str, Any]:
    """Arguments built from a possible answer: for each parameter, the first allowed value
    other than "" that BFCL accepts once written as an argument (`_argument_from`), else the
    first one; a parameter whose only allowed value is "" is left out, unless the schema
    requires it (then "" is given, which BFCL accepts)."""
    parameters = (function_schema or {}).get("parameters") or {}
    properties = parameters.get("properties") or {}
    required = parameters.get("required") or []
    arguments = {}
    for param, allowed in params.items():
        schema = properties.get(param) if isinstance(properties.get(param), Mapping) else {}
        answers = [a for a in _as_list(allowed) if not (type(a) is str and a == "")]
        candidates = [_argument_from(answer, schema, language) for answer in answers]
        valid = [c for c in candidates if argument_is_valid(c, allowed, schema, language)]
        if valid or candidates:
            arguments[param] = (valid or candidates)[0]
        elif param in required:
            arguments[param] = ""
    return arguments


@dataclass(frozen=True)
class CallScore:
    """One call judged against one reference call: `right` of `total` units."""

    right: int
    total: int

    @property
    def valid(self) -> bool:
        return self.right == self.total


def score_call(
    function_schema: Mapping[str, Any] | None,
    name: Any,
    arguments: Any,
    reference_name: str,
    reference_params: Mapping[str, Any],
    language: str = "python",
) -> CallScore:
    """Units right for a call (`name`, `arguments`) against one reference call.

    function_schema: the offered function named `reference_name` ({"name", "parameters":
    {"properties", "required"}}), or None when it is not offered. language: how values are
    read ("python", or "java"/"javascript" for BFCL's typed strings).
    """
    units = 1 + len(reference_params)
    if name != reference_name or not isinstance(arguments, dict):
        return CallScore(right=0, total=units)  # the arguments belong to another function
    parameters = function_schema.get("parameters", {}) if function_schema else {}
    properties = parameters.get("properties") or {}
    required = parameters.get("required") or []
    right = 1
    for param, allowed in reference_params.items():
        if param in arguments:
            right += param in properties and argument_is_valid(
                arguments[param], allowed, properties[param], language
            )
        else:
            right += "" in _as_list(allowed) and param not in required
    unexpected = [param for param in arguments if param not in reference_params]
    missing_required = [p for p in required if p not in arguments and p not in reference_params]
    return CallScore(right=int(right), total=units + len(unexpected) + len(missing_required))


@dataclass(frozen=True)
class CallsScore:
    """A response's calls judged against the reference calls.

    matches: for each reference call, the index of the call matched to it (None: no call left).
    """

    right: int
    total: int
    matches: tuple[int | None, ...]

    @property
    def score(self) -> float:
        return self.right / self.total if self.total else 1.0

    @property
    def valid(self) -> bool:
        return self.right == self.total


def function_by_name(functions: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    """The first offered function called `name` (BFCL's find_description), or None."""
    for function in functions:
        if function.get("name") == name:
            return function
    return None


def score_calls(
    functions: Sequence[Mapping[str, Any]],
    calls: Sequence[tuple[Any, Any]],
    ground_truth: Sequence[Mapping[str, Mapping[str, Any]]],
    language: str = "python",
) -> CallsScore:
    """Score calls [(name, arguments), ...] against BFCL ground truth [{name: {param: allowed}}]
    (values read as `language` reads them: see `score_call`).

    Unparseable calls can be passed as (None, None): they match nothing but still count.
    First BFCL's pass: each reference, in order, takes the first free call valid for it.
    References left without one then take, in order, the free call with the best partial
    score (ties: the first). A reference left over in the first pass has no valid call among
    the free ones, and later ones only take calls away, so it stays below 1: the score is 1.0
    exactly when BFCL's greedy pass succeeds with no call to spare.
    """
    references = []
    for reference in ground_truth:
        ((reference_name, reference_params),) = reference.items()
        references.append(
            (function_by_name(functions, reference_name), reference_name, reference_params)
        )
    free = list(range(len(calls)))
    results: list[tuple[CallScore, int | None] | None] = [None] * len(references)

    for position, (schema, reference_name, reference_params) in enumerate(references):
        for index in free:
            score = score_call(schema, *calls[index], reference_name, reference_params, language)
            if score.valid:
                results[position] = (score, index)
                free.remove(index)
                break

    for position, (schema, reference_name, reference_params) in enumerate(references):
        if results[position] is not None:
            continue
        scored = [
            (score_call(schema, *calls[index], reference_name, reference_params, language), index)
            for index in free
        ]
        if scored:
            score, index = max(scored, key=lambda pair: (pair[0].right / pair[0].total, -pair[1]))
            free.remove(index)
            results[position] = (score, index)
        else:
            results[position] = (CallScore(right=0, total=1 + len(reference_params)), None)

    right = sum(score.right for score, _ in results)
    total = sum(score.total for score, _ in results) + len(
        free
    )  # surplus calls: one wrong unit each
    return CallsScore(right=right, total=total, matches=tuple(index for _, index in results))


def reference_calls_text(
    ground_truth: Sequence[Mapping[str, Mapping[str, Sequence[Any]]]],
    functions: Sequence[Mapping[str, Any]] = (),
    language: str = "python",
) -> str:
    """The reference call blocks: each parameter's first allowed value other than "" (a
    parameter whose only allowed value is "" is left out); `functions` (the offered function
    descriptions) tell which parameters are dicts, whose answers are specs built key by key,
    and, in Java and JavaScript, how each value is written (`reference_arguments`)."""
    blocks = []
    for call in ground_truth:
        ((name, params),) = call.items()
        arguments = reference_arguments(function_by_name(functions, name), params, language)
        call_json = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        blocks.append(f"<tool_call>\n{call_json}\n</tool_call>")
    return "\n".join(blocks)
