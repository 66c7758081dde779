"""Java and JavaScript argument values as BFCL v4 reads them (`simple_java`, `simple_javascript`).

In these categories every argument is a *string* holding a Java or JavaScript literal (the
prompt says so: each parameter is shown as a string "in Java/JavaScript representation"). BFCL's
checker turns the string into a Python value according to the declared type, then applies its
usual rules (`bfcl.argument_is_valid`). A string that does not look like its type is kept as a
string, which then fails the type check. The rules below are those of
`bfcl_eval/eval_checker/ast_eval/type_convertor/{java,js}_type_converter.py` (BFCL v4), written
anew here; their quirks are kept, since the leaderboard's numbers depend on them:

Java
- byte/short/integer `-?\\d+`; long needs the `L` suffix (`42L`); float needs `f` (`1.5f`);
  double has none (`1.5`); boolean `true`/`false`; String, char and any: the text itself (so a
  String value is written *without* quotes: `"abc"` would keep them);
- `new T[]{a, b}` (Array): the elements are converted with the item type, so `String`
  elements are taken as written (`new String[]{a, b}`; quotes would stay in the values);
- `new ArrayList<>(Arrays.asList(a, b))` or `new ArrayList<>() {{ add(a); add(b); }}`
  (ArrayList): `String`/`char` elements lose their first and last character (their quotes),
  other elements are converted with the item type;
- `new HashMap<K, V>() {{ put("k", v); }}` (HashMap): values read as plain Java literals;
- Set, Hashtable, Queue and Stack are not converted (BFCL raises there; no v4 entry uses them).

JavaScript
- String: quotes (`"..."` or `'...'`) are removed when present; any: the text itself;
  integer `-?\\d+`; float `-?\\d+(\\.\\d+)?`; Bigint `-?\\d+n`; Boolean `true`/`false`;
- array: `[a, b]` or `new Array(a, b)`, split on commas, elements converted with the item type
  (quoted ones lose their quotes); `[[..], [..]]` gives lists of plain literals;
- dict: `{k: v, ...}` up to the first `}`, values read as plain literals after their quotes are
  stripped (so `'5'` reads as the number 5).

`java_literal`/`javascript_literal` go the other way: a text BFCL reads back as the given value
(used to write reference responses), or None when no text can.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Declared Java type -> the Python type of the converted value (BFCL's JAVA_TYPE_CONVERSION).
JAVA_TYPES: dict[str, type] = {
    "byte": int,
    "short": int,
    "integer": int,
    "float": float,
    "double": float,
    "long": int,
    "boolean": bool,
    "char": str,
    "Array": list,
    "ArrayList": list,
    "Set": set,
    "HashMap": dict,
    "Hashtable": dict,
    "Queue": list,
    "Stack": list,
    "String": str,
    "any": str,
}
# Declared JavaScript type -> Python type (BFCL's JS_TYPE_CONVERSION).
JAVASCRIPT_TYPES: dict[str, type] = {
    "String": str,
    "integer": int,
    "float": float,
    "Bigint": int,
    "Boolean": bool,
    "dict": dict,
    "array": list,
    "any": str,
}
# Declared types whose elements are converted with the schema's item type.
JAVA_ARRAYS = ("Array", "ArrayList")
JAVASCRIPT_ARRAYS = ("array",)

_INTEGER = re.compile(r"^-?\d+$")
_JAVA_FLOAT = re.compile(r"^-?\d+(\.\d+)?([eE][+-]?\d+)?[fF]$")
_JAVA_DOUBLE = re.compile(r"^-?\d+(\.\d+)?([eE][+-]?\d+)?$")
_JAVA_LONG = re.compile(r"^-?\d+[lL]$")
_JAVA_ARRAY = re.compile(r"new\s+\w+\[\]\s*\{(.*?)\}")
_JAVA_AS_LIST = re.compile(r"new\s+ArrayList<\w*>\(Arrays\.asList\((.+?)\)\)")
_JAVA_ADDS = re.compile(r"new\s+ArrayList<\w*>\(\)\s*\{\{\s*(.+?)\s*\}\}", re.DOTALL)
_JAVA_ADD = re.compile(r"add\((.+?)\)")
_JAVA_EMPTY_LIST = re.compile(r"new\s+ArrayList<\w*>\(\)")
_JAVA_MAP = re.compile(r"new\s+HashMap<.*?>\s*\(\)\s*\{\s*\{?\s*(.*?)\s*\}?\s*\}", re.DOTALL)
_JAVA_PUT = re.compile(r"put\(\"(.*?)\",\s*(.*?)\)")
_JAVA_EMPTY_MAP = re.compile(r"new\s+HashMap<.*?>\s*\(\)")
_JS_FLOAT = re.compile(r"^-?\d+(\.\d+)?$")
_JS_BIGINT = re.compile(r"^-?\d+n$")
_JS_NESTED_ARRAY = re.compile(
    r"\[\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\]|\bnew\s+Array\(\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\)"
)
_JS_ARRAY = re.compile(r"\[(.*?)\]|\bnew\s+Array\((.*?)\)")
_JS_BRACKETED = re.compile(r"\[(.*?)\]")
_JS_OBJECT = re.compile(r"\{(.*?)\}")
_JS_PAIR = re.compile(r"([^:]+):\s*(.*?)(?:,\s*(?=[^,]+:)|$)")


def _number(text: str) -> Any:
    """Python's int(), else float(), else the text: the fallback of both plain-literal readers."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def _quoted(text: str, quotes: str) -> bool:
    return len(text) >= 1 and any(text.startswith(q) and text.endswith(q) for q in quotes)


# -- Java ------------------------------------------------------------------------------


def plain_java_value(text: str) -> Any:
    """A Java literal read without a declared type (HashMap values, untyped elements)."""
    if text in ("true", "false"):
        return text == "true"
    if _quoted(text, '"'):
        return text[1:-1]
    if _JAVA_LONG.match(text):
        return int(text[:-1])
    if _JAVA_FLOAT.match(text):
        return float(text[:-1])
    return _number(text)


def _java_element(text: str, item_type: str | None, strip_quotes: bool) -> Any:
    if strip_quotes and item_type in ("char", "String"):
        return text[1:-1]
    return java_value(text, item_type) if item_type else plain_java_value(text)


def _java_list(text: str, item_type: str | None) -> Any:
    match = _JAVA_AS_LIST.search(text)
    if match:
        parts = [part.strip() for part in match.group(1).split(",")]
        return [_java_element(part, item_type, strip_quotes=True) for part in parts]
    match = _JAVA_ADDS.search(text)
    if match:
        parts = [part.strip() for part in _JAVA_ADD.findall(match.group(1))]
        return [_java_element(part, item_type, strip_quotes=True) for part in parts]
    if _JAVA_EMPTY_LIST.search(text):
        return []
    return text


def _java_array(text: str, item_type: str | None) -> Any:
    match = _JAVA_ARRAY.search(text)
    if not match:
        return text
    parts = [part.strip() for part in match.group(1).split(",") if part.strip()]
    return [_java_element(part, item_type, strip_quotes=False) for part in parts]


def _java_map(text: str) -> Any:
    match = _JAVA_MAP.search(text)
    if match:
        return {key: plain_java_value(value.strip()) for key, value in _JAVA_PUT.findall(match[1])}
    if _JAVA_EMPTY_MAP.search(text):
        return {}
    return text


def java_value(text: str, declared: str, item_type: str | None = None) -> Any:
    """The Python value BFCL reads from the string `text` for a Java parameter of type
    `declared` (elements of Array/ArrayList with `item_type`); the text itself when it does
    not have the type's form."""
    if declared in ("byte", "short", "integer"):
        return int(text) if _INTEGER.match(text) else text
    if declared == "float":
        return float(text[:-1]) if _JAVA_FLOAT.match(text) else text
    if declared == "double":
        return float(text) if _JAVA_DOUBLE.match(text) else text
    if declared == "long":
        return int(text[:-1]) if _JAVA_LONG.match(text) else text
    if declared == "boolean":
        return text == "true" if text in ("true", "false") else text
    if declared == "ArrayList":
        return _java_list(text, item_type)
    if declared == "Array":
        return _java_array(text, item_type)
    if declared == "HashMap":
        return _java_map(text)
    return text  # String, char, any; Set, Hashtable, Queue, Stack are not converted


# -- JavaScript -------------------------------------------------------------------------


def plain_javascript_value(text: str) -> Any:
    """A JavaScript literal read without a declared type."""
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if _quoted(text, "\"'"):
        return text[1:-1]
    return _number(text)


def _javascript_array(text: str, item_type: str | None) -> Any:
    nested = _JS_NESTED_ARRAY.match(text)
    if nested:
        rows = []
        for index, inner in enumerate(_JS_BRACKETED.findall(nested.group(0))):
            inner = inner.strip()
            if index == 0 and inner.startswith("["):
                inner = inner[1:]
            rows.append([plain_javascript_value(part.strip()) for part in inner.split(",")])
        return rows
    match = _JS_ARRAY.match(text)
    if not match:
        return text
    inside = (match.group(1) if match.group(1) is not None else match.group(2) or "").strip()
    parts = inside.split(",") if inside else []
    if not item_type:
        return [plain_javascript_value(part.strip()) for part in parts]
    if item_type not in JAVASCRIPT_TYPES:  # BFCL's converter raises, and the text is kept
        return text
    return [javascript_value(part.strip(), item_type) for part in parts]


def _javascript_object(text: str) -> Any:
    if text == "{}":
        return {}
    match = _JS_OBJECT.match(text)
    if not match:
        return text
    result: dict[str, Any] = {}
    for key, value in _JS_PAIR.findall(match.group(1)):
        key, value = key.strip().strip("'\""), value.strip()
        if value.startswith("[") and value.endswith("]"):
            result[key] = _javascript_array(value, None)
        elif value.startswith("{") and value.endswith("}"):
            result[key] = _javascript_object(value)
        else:
            result[key] = plain_javascript_value(value.strip("'\""))
    return result


def javascript_value(text: str, declared: str, item_type: str | None = None) -> Any:
    """The Python value BFCL reads from the string `text` for a JavaScript parameter of type
    `declared` (array elements with `item_type`); the text itself when it does not have the
    type's form."""
    if declared == "String":
        return text[1:-1] if _quoted(text, "\"'") else text
    if declared == "integer":
        return int(text) if _INTEGER.match(text) else text
    if declared == "float":
        return float(text) if _JS_FLOAT.match(text) else text
    if declared == "Bigint":
        return int(text[:-1]) if _JS_BIGINT.match(text) else text
    if declared == "Boolean":
        return text == "true" if text in ("true", "false") else text
    if declared == "dict":
        return _javascript_object(text.strip())
    if declared == "array":
        return _javascript_array(text.strip(), item_type)
    return text  # any


# -- writing literals (reference responses) --------------------------------------------


def _number_text(value: Any) -> str | None:
    if type(value) is bool or not isinstance(value, int | float):
        return None
    return repr(value)


def _java_element_literal(value: Any, item_type: str | None, quoted: bool) -> str | None:
    if quoted and item_type in ("char", "String"):
        return f'"{value}"' if type(value) is str else None
    if item_type:
        return java_literal(value, item_type)
    return _plain_java_literal(value)


def _plain_java_literal(value: Any) -> str | None:
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is str:
        return f'"{value}"'
    return _number_text(value)


def java_literal(value: Any, declared: str, item_type: str | None = None) -> str | None:
    """A Java literal that `java_value(…, declared, item_type)` reads back as `value`
    (None when the type has no literal form for it)."""
    if type(value) is str and declared not in ("HashMap",):
        return value  # String/char/any, or a variable name standing for the value
    if declared in ("byte", "short", "integer", "double"):
        return _number_text(value) if declared == "double" or type(value) is int else None
    if declared in ("long", "float"):
        number = _number_text(value)
        if number is None or (declared == "long" and type(value) is not int):
            return None
        return number + ("L" if declared == "long" else "f")
    if declared == "boolean":
        return _plain_java_literal(value) if type(value) is bool else None
    if declared in JAVA_ARRAYS and type(value) is list:
        elements = [
            _java_element_literal(element, item_type, quoted=declared == "ArrayList")
            for element in value
        ]
        if any(element is None for element in elements):
            return None
        if declared == "Array":
            return "new Object[]{" + ", ".join(elements) + "}"  # type: ignore[arg-type]
        return "new ArrayList<>(Arrays.asList(" + ", ".join(elements) + "))"  # type: ignore[arg-type]
    if declared == "HashMap" and type(value) is dict:
        puts = [(key, _plain_java_literal(element)) for key, element in value.items()]
        if any(text is None for _, text in puts):
            return None
        body = " ".join(f'put("{key}", {text});' for key, text in puts)
        return "new HashMap<String, Object>() {{ " + body + " }}"
    return None


def _plain_javascript_literal(value: Any) -> str | None:
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is str:
        return f'"{value}"'
    return _number_text(value)


def javascript_literal(value: Any, declared: str, item_type: str | None = None) -> str | None:
    """A JavaScript literal that `javascript_value(…, declared, item_type)` reads back as
    `value` (None when the type has no literal form for it)."""
    if declared == "String" and type(value) is str:
        return f'"{value}"'
    if type(value) is str and declared != "dict":
        return value  # any, or a variable name standing for the value
    if declared in ("integer", "Bigint"):
        if type(value) is not int:
            return None
        return str(value) + ("n" if declared == "Bigint" else "")
    if declared == "float":
        return _number_text(value)
    if declared == "Boolean":
        return _plain_javascript_literal(value) if type(value) is bool else None
    if declared == "array" and type(value) is list:
        elements = [
            javascript_literal(element, item_type)
            if item_type
            else _plain_javascript_literal(element)
            for element in value
        ]
        if any(element is None for element in elements):
            return None
        return "[" + ", ".join(elements) + "]"  # type: ignore[arg-type]
    if declared == "dict" and type(value) is dict:
        pairs = []
        for key, element in value.items():
            if type(element) is list:
                text = javascript_literal(element, "array")
            elif type(element) is dict:
                text = javascript_literal(element, "dict")
            else:
                text = _plain_javascript_literal(element)
            if text is None:
                return None
            pairs.append(f"{key}: {text}")
        return "{" + ", ".join(pairs) + "}"
    return None


def declared_types(param_schema: Mapping[str, Any]) -> tuple[Any, Any]:
    """(declared type, item type) of a parameter schema (None where absent)."""
    if not isinstance(param_schema, Mapping):
        return None, None
    items = param_schema.get("items")
    return param_schema.get("type"), items.get("type") if isinstance(items, Mapping) else None
