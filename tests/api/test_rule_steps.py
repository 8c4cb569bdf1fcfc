"""`x-kiln-rules` name the step that enforces each rule by a stable id
(kiln.api.openapi_rule_parts.STEPS), never by a Python path: every rule of every operation, under
each kind of served bounds, has one of the ids, and each key of the table resolves to the code it
names (a module, or a module's attribute), so the table moves with the code."""

from __future__ import annotations

import importlib
import itertools

from kiln.api.openapi_rule_parts import STEPS
from kiln.api.openapi_rules import operation_rules
from kiln.api.served_openapi import Bounds


def test_every_rule_names_a_stable_step() -> None:
    ids = set(STEPS.values())
    assert len(ids) == len(STEPS)  # one id per step
    seen: set[str] = set()
    for grammars, budget, max_new, names in itertools.product(
            (True, False), (True, False), (None, 100), (("m",), ("m", "adapter"))):
        bounds = Bounds(49152, 20, 8192, 64, names, budget, grammars, max_new)
        for rules in operation_rules(bounds).values():
            seen |= {r["where"] for r in rules}
    assert seen <= ids and not any("." in step for step in seen)


def test_each_step_key_resolves_to_its_code() -> None:
    for where in STEPS:
        path = where.split(" (")[0]
        try:
            importlib.import_module(path)
            continue
        except ModuleNotFoundError:
            module, _, name = path.rpartition(".")
        assert hasattr(importlib.import_module(module), name), where
