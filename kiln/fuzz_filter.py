"""The fuzz runs' filter: a generic evaluator of the served document's `x-kiln-rules`.

Shared by the in-process run (tests/api/test_schemathesis.py) and the live one
(bench/fuzz_live.py): tests/ and bench/ must not import each other, so it sits in the package
both exercise. Nothing that serves requests imports it (tests/test_import_boundaries.py).

It knows no route and no field: each operation of the served /openapi.json lists the rules its
handler enforces beyond the JSON Schema (kiln/api/openapi_rules.py writes them, from the
constants the handlers enforce; docs/openapi-extensions.md defines the kinds), and a body is
generated only when the evaluator can show that it keeps every one of them. Where the evaluator
cannot decide a rule exactly it stays on the safe side:

- a length in tokens of a text (measure ``text_tokens``) is bounded above by its UTF-8 length plus
  ``TOKEN_SLACK`` (no tokenizer this server loads makes more than one token per byte, beside the
  special tokens it adds); a rendered conversation (``rendered_tokens``) by the UTF-8 length of
  its JSON text plus ``TEMPLATE_SLACK`` (a template's markers and default system prompt): an
  estimate, not a proof, kept far from the bounds by the runs' small bodies;
- ``compiles`` (a regex, grammar or JSON Schema the server compiles with llguidance against the
  model's tokenizer): a body that sets such a field is not generated, since only the server's
  compiler can say;
- ``model_dependent`` (what the model's chat template or tokenizer decides): a body its ``when``
  accepts is not generated; one without ``when`` (the template's verdict on any conversation)
  cannot be kept out, so it is not evaluated, and a run that meets it reports it.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import jsonschema_rs

TOKEN_SLACK = 4
TEMPLATE_SLACK = 512
_ABSENT = object()
_OPS: dict[str, Callable[[Any, Any], bool]] = {"<=": operator.le, "<": operator.lt}
Rule = dict[str, Any]


def rules_of(operation: object) -> list[Rule]:
    """An operation object's `x-kiln-rules` (none when it has none)."""
    found = operation.get("x-kiln-rules") if isinstance(operation, dict) else None
    return list(found) if isinstance(found, list) else []


def accepted(rules: list[Rule], body: object) -> bool:
    """Whether ``body`` keeps every rule, as far as the evaluator can show (module doc)."""
    return refusal(rules, body) is None


def refusal(rules: list[Rule], body: object) -> Rule | None:
    """The first rule ``body`` may break, else None."""
    if not isinstance(body, dict):
        return None
    for rule in rules:
        when = rule.get("when")
        if when is not None and not matches(when, body):
            continue
        check = _KINDS.get(rule["kind"])
        if check is None:
            raise ValueError(f"unknown x-kiln-rules kind {rule['kind']!r}")
        if not check(rule, body):
            return rule
    return None


@lru_cache(maxsize=512)
def _validator(schema_text: str) -> Any:
    return jsonschema_rs.Draft202012Validator(json.loads(schema_text))


def matches(schema: object, instance: object) -> bool:
    """JSON Schema 2020-12 validation (JSON equality: true is not 1)."""
    return bool(_validator(json.dumps(schema, sort_keys=True)).is_valid(instance))


def resolve(body: object, path: str) -> list[Any]:
    """The values at a dotted ``path`` (``[*]`` after a name: each item of that array); empty
    when any step is missing."""
    found = [body]
    for step in path.split("."):
        each = step.endswith("[*]")
        name = step[:-3] if each else step
        nxt: list[Any] = []
        for holder in found:
            if not isinstance(holder, dict) or name not in holder:
                continue
            v = holder[name]
            if each:
                nxt.extend(v if isinstance(v, list) else [])
            else:
                nxt.append(v)
        found = nxt
    return found


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _tokens(v: object) -> tuple[float, bool] | None:
    """(upper bound, exact) of a prompt's tokens: a text, token IDs, or a list of either."""
    if isinstance(v, str):
        return len(v.encode()) + TOKEN_SLACK, False
    if isinstance(v, list) and all(_number(x) for x in v):
        return len(v), True
    if isinstance(v, list):
        parts = [_tokens(x) for x in v]
        if not parts or any(p is None for p in parts):
            return None
        return max(p[0] for p in parts if p), all(p[1] for p in parts if p)
    return None


def _measure(kind: str, v: object) -> tuple[float, bool] | None:
    if kind == "value":
        return (v, True) if isinstance(v, int | float) and _number(v) else None  # ints exact
    if kind == "length":
        return (1, True) if isinstance(v, str) else (len(v), True) if isinstance(v, list) else None
    if kind == "prompt_count":
        if isinstance(v, str) or (isinstance(v, list) and all(_number(x) for x in v)):
            return 1, True
        return (len(v), True) if isinstance(v, list) else None
    if kind == "utf8_bytes":
        texts = [v] if isinstance(v, str) else v if isinstance(v, list) else None
        if texts is None or not all(isinstance(t, str) for t in texts):
            return None
        return sum(len(t.encode()) for t in texts), True
    if kind == "text_tokens":
        return _tokens(v)
    if kind == "rendered_tokens":
        return len(json.dumps(v, ensure_ascii=False).encode()) + TEMPLATE_SLACK, False
    raise ValueError(f"unknown x-kiln-rules measure {kind!r}")


def operand(spec: dict[str, Any], body: object) -> tuple[float, bool] | None:
    """(value or its upper bound, exact) of an operand; None: the rule does not apply."""
    if "value" in spec:
        return spec["value"], True
    state = "absent"
    for path in spec["fields"]:
        values = resolve(body, path)
        present = [v for v in values if v is not None]
        if present:
            measured = [_measure(spec.get("measure", "value"), v) for v in present]
            if any(m is None for m in measured):
                return None
            top = max(m[0] for m in measured if m)
            return top + spec.get("add", 0), all(m[1] for m in measured if m)
        if values:
            state = "null"
    key = "if_absent" if state == "absent" else "if_null"
    return (spec[key] + spec.get("add", 0), True) if key in spec else None


def _compare(rule: Rule, body: dict[str, Any]) -> bool:
    left, right = operand(rule["left"], body), operand(rule["right"], body)
    if left is None or right is None:
        return True
    if not right[1]:  # only an exact right side can be compared with an upper bound
        return False
    return _OPS[rule["op"]](left[0], right[0])


def _product_max(rule: Rule, body: dict[str, Any]) -> bool:
    product = 1.0
    for spec in rule["factors"]:
        got = operand(spec, body)
        if got is None:
            return True
        product *= got[0]
    return bool(product <= rule["max"])


def _non_default(rule: Rule, body: dict[str, Any]) -> bool:
    return all(matches({"enum": rule["default"]}, v) for v in resolve(body, rule["field"]))


def _at_most_one(rule: Rule, body: dict[str, Any]) -> bool:
    unset = {"enum": rule["unset"]}
    return sum(1 for path in rule["fields"]
               for v in resolve(body, path) if not matches(unset, v)) <= 1


def _last_item(rule: Rule, body: dict[str, Any]) -> bool:
    items = [v for v in resolve(body, rule["field"]) if isinstance(v, list)]
    return all(v and matches(rule["matches"], v[-1]) for v in items)


def _refers_to(rule: Rule, body: dict[str, Any]) -> bool:
    among = resolve(body, rule["among"])
    return all(v in among for v in resolve(body, rule["field"]))


def _compiles(rule: Rule, body: dict[str, Any]) -> bool:
    return all(v is None or v is False for v in resolve(body, rule["field"]))


_KINDS: dict[str, Callable[[Rule, dict[str, Any]], bool]] = {
    "refused_when": lambda rule, body: False,
    "non_default_refused": _non_default,
    "at_most_one": _at_most_one,
    "compare": _compare,
    "product_max": _product_max,
    "last_item": _last_item,
    "refers_to": _refers_to,
    "compiles": _compiles,
    "model_dependent": lambda rule, body: "when" not in rule,
}
