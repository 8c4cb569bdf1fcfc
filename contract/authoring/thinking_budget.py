"""The sibling schema thinking-budget-v1.schema.json."""

from __future__ import annotations

from .common import BASE_URI, DIALECT, TB_FILE, Schema

SOURCES_FINITE = ["server_default", "request", "suite", "run_override", "example", "unknown"]
SOURCES_UNLIMITED = [
    "unlimited",
    "request_unlimited",
    "suite_unlimited",
    "run_override_unlimited",
    "example_unlimited",
    "unknown",
]
SOURCES = [
    "unlimited",
    "server_default",
    "request",
    "request_unlimited",
    "suite",
    "suite_unlimited",
    "run_override",
    "run_override_unlimited",
    "example",
    "example_unlimited",
    "unknown",
]


def _count(description: str) -> Schema:
    return {"type": "integer", "minimum": 0, "description": description}


def _limit_matches_source(limit: str, source: str) -> Schema:
    """A finite limit needs a finite source; an absent limit needs an unlimited one."""
    return {
        "if": {"required": [limit]},
        "then": {"properties": {source: {"enum": SOURCES_FINITE}}},
        "else": {"properties": {source: {"enum": SOURCES_UNLIMITED}}},
    }


def thinking_budget_schema() -> Schema:
    any_limit = {"anyOf": [{"required": ["max_tokens"]}, {"required": ["max_time_ms"]}]}
    outcome_props: Schema = {
        "triggered": {
            "type": "boolean",
            "description": "Whether a limit forced the close sequence (trigger is then present).",
        },
        "trigger": {"$ref": "#/$defs/trigger"},
        "closed": {
            "type": "boolean",
            "description": "Whether the thinking block was closed (naturally or by force).",
        },
        "thinking_tokens": _count("Generated tokens counted as thinking."),
        "thinking_time_ms": _count("Thinking time in milliseconds, from the first decode step."),
    }
    record_outcome_props: Schema = {
        "applied": {
            "type": "boolean",
            "description": (
                "Whether the limit applied: configured, the rendered prompt starts inside a "
                "reasoning block, and max_tokens > 0."
            ),
        },
        **outcome_props,
    }
    trigger_iff_triggered = {
        "if": {"properties": {"triggered": {"const": True}}, "required": ["triggered"]},
        "then": {"required": ["trigger"]},
        "else": {"not": {"required": ["trigger"]}},
    }
    defs: dict[str, Schema] = {
        "limitOverride": {
            "description": (
                "A per-request thinking limit. Applies only when the property is present; absence "
                "inherits the server default."
            ),
            "oneOf": [
                {"type": "null", "description": "Explicitly unlimited, even over a default."},
                {
                    "type": "integer",
                    "minimum": 0,
                    "description": (
                        "Finite limit; 0 means closure starts at the first decode candidate."
                    ),
                },
            ],
        },
        "source": {
            "description": (
                "Authority that supplied or removed a thinking limit. An `_unlimited` suffix means "
                "that surface explicitly removed an inherited limit."
            ),
            "type": "string",
            "enum": SOURCES,
        },
        "trigger": {
            "description": (
                "The boundary that forced the close sequence; `max_tokens` is the remaining "
                "completion capacity."
            ),
            "type": "string",
            "enum": ["tokens", "time", "max_tokens"],
        },
        "request": {
            "description": "The thinking-budget fields of a request body.",
            "type": "object",
            "properties": {
                "thinking_budget_tokens": {"$ref": "#/$defs/limitOverride"},
                "thinking_budget_ms": {"$ref": "#/$defs/limitOverride"},
            },
            "additionalProperties": True,
        },
        "serverDefaults": {
            "description": "Server-wide default thinking limits; null means unlimited.",
            "type": "object",
            "required": ["default_thinking_budget_tokens", "default_thinking_budget_ms"],
            "properties": {
                "default_thinking_budget_tokens": {
                    "oneOf": [{"type": "null"}, {"type": "integer", "minimum": 0}]
                },
                "default_thinking_budget_ms": {
                    "oneOf": [{"type": "null"}, {"type": "integer", "minimum": 0}]
                },
            },
            "additionalProperties": False,
        },
        "effective": {
            "description": (
                "Resolved thinking limits and their sources. An absent limit means that dimension "
                "is unlimited; `configured` is true exactly when a limit is present."
            ),
            "type": "object",
            "required": ["configured", "tokens_source", "time_source"],
            "properties": {
                "configured": {
                    "type": "boolean",
                    "description": "Whether either resolved thinking limit is finite.",
                },
                "max_tokens": _count("Resolved thinking-token limit; omitted when unlimited."),
                "max_time_ms": _count(
                    "Resolved thinking-time limit in milliseconds; omitted when unlimited."
                ),
                "tokens_source": {"$ref": "#/$defs/source"},
                "time_source": {"$ref": "#/$defs/source"},
            },
            "allOf": [
                {
                    "if": {
                        "properties": {"configured": {"const": True}},
                        "required": ["configured"],
                    },
                    "then": any_limit,
                    "else": {"not": any_limit},
                },
                _limit_matches_source("max_tokens", "tokens_source"),
                _limit_matches_source("max_time_ms", "time_source"),
            ],
        },
        "outcome": {
            "description": (
                "Per-completion terminal thinking-budget state. A natural close has "
                "`triggered: false` and no `trigger`."
            ),
            "type": "object",
            "required": ["triggered", "closed", "thinking_tokens", "thinking_time_ms"],
            "properties": outcome_props,
            "additionalProperties": False,
            "allOf": [trigger_iff_triggered],
        },
        "record": {
            "description": (
                "The flat thinking-budget record written by chat, streaming and batch: the "
                "resolved limits plus, when a budget applied and finished, its outcome."
            ),
            "allOf": [
                {"$ref": "#/$defs/effective"},
                {
                    "type": "object",
                    "required": ["applied", "triggered"],
                    "properties": record_outcome_props,
                },
                {
                    "if": {"properties": {"applied": {"const": True}}, "required": ["applied"]},
                    "then": {"properties": {"configured": {"const": True}}},
                },
                {
                    "if": {"required": ["closed"]},
                    "then": {
                        "required": ["thinking_tokens", "thinking_time_ms"],
                        "properties": {"applied": {"const": True}},
                        **trigger_iff_triggered,
                    },
                    "else": {
                        "properties": {"triggered": {"const": False}},
                        "not": {
                            "anyOf": [
                                {"required": ["trigger"]},
                                {"required": ["thinking_tokens"]},
                                {"required": ["thinking_time_ms"]},
                            ]
                        },
                    },
                },
            ],
            "unevaluatedProperties": False,
        },
        "recentRecord": {
            "description": (
                "A thinking-budget record in the recent-requests log; outcome fields may be "
                "absent when the request failed before they were known."
            ),
            "allOf": [
                {"$ref": "#/$defs/effective"},
                {"type": "object", "properties": record_outcome_props},
            ],
            "unevaluatedProperties": False,
        },
    }
    return {
        "$schema": DIALECT,
        "$id": BASE_URI + TB_FILE,
        "title": "Kiln thinking-budget contract v1",
        "description": (
            "Thinking-budget fragments shared by the inference contract: request overrides, "
            "server defaults, resolved limits, terminal outcomes, and records."
        ),
        "$defs": defs,
    }
