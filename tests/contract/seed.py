"""Parser for the seed documentation page of the Kiln inference contract.

The seed (``shared/seeds/kiln-inference-contract-v1.md``) is a rendered documentation page: one
header line per definition (``<Name><Description><N> fields``), a ``Type:`` line, a tab-separated
field table, and JSON blocks for composition rules and ``x-kiln-*`` annotations. This module turns
it back into plain data so that tests can compare the contract against it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEED_NAME = "kiln-inference-contract-v1.md"

_HEADER = re.compile(
    r"^(?P<name>[A-Za-z0-9]+?)"
    r"(?P<desc>(?:OpenAI|[A-Z][a-z]*)(?:-[a-z]+)*[,.]? .*?)"
    r"(?P<count>\d+) fields?$"
)
_FIELD_ROW = re.compile(
    r"^`(?P<name>[A-Za-z0-9_]+)`\t(?P<required>yes|no)\t`(?P<type>[^`]+)`\t"
    r"(?P<constraints>[^\t]*)\t(?P<description>.*)$"
)
_ENTRYPOINT_ROW = re.compile(
    r"^`(?P<name>[A-Za-z]+)`\t(?P<purpose>[^\t]+)\t(?P<count>\d+) fields?\t"
)


@dataclass
class SeedField:
    name: str
    required: bool
    type: str
    constraints: str
    description: str


@dataclass
class SeedDefinition:
    name: str
    description: str
    field_count: int
    type_line: str = ""
    fields: list[SeedField] = field(default_factory=list)
    composition: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None

    @property
    def closed(self) -> bool:
        return "closed object" in self.type_line


@dataclass
class Seed:
    entrypoints: dict[str, int]
    root_composition: dict[str, Any]
    root_annotations: dict[str, Any]
    definitions: dict[str, SeedDefinition]


def find_seed() -> Path | None:
    """Locate the seed: ``<repo>/../shared/seeds`` (CI) or ``<repo>/shared/seeds``."""
    repo = Path(__file__).resolve().parents[2]
    for candidate in (
        repo.parent / "shared" / "seeds" / SEED_NAME,
        repo / "shared" / "seeds" / SEED_NAME,
    ):
        if candidate.is_file():
            return candidate
    return None


def _json_block(lines: list[str], start: int) -> tuple[dict[str, Any], int]:
    """Parse the JSON object that begins at the first ``{`` line at or after ``start``."""
    i = start
    while lines[i].strip() != "{":
        i += 1
    j = i
    while lines[j] != "}":
        j += 1
    return json.loads("\n".join(lines[i : j + 1])), j + 1


def parse_seed(text: str) -> Seed:
    lines = text.splitlines()
    defs_at = lines.index("Definitions")
    head, body = lines[:defs_at], lines[defs_at + 1 :]

    entrypoints: dict[str, int] = {}
    root_composition: dict[str, Any] = {}
    root_annotations: dict[str, Any] = {}
    i = 0
    while i < len(head):
        line = head[i]
        m = _ENTRYPOINT_ROW.match(line)
        if m:
            entrypoints[m["name"]] = int(m["count"])
        elif line == "Composition and conditional rules":
            root_composition, i = _json_block(head, i + 1)
            continue
        elif line == "Kiln contract annotations":
            root_annotations, i = _json_block(head, i + 1)
            continue
        i += 1

    definitions: dict[str, SeedDefinition] = {}
    current: SeedDefinition | None = None
    i = 0
    while i < len(body):
        line = body[i]
        header = _HEADER.match(line)
        if header and not line.startswith("`"):
            current = SeedDefinition(
                name=header["name"],
                description=header["desc"],
                field_count=int(header["count"]),
            )
            definitions[current.name] = current
        elif current is not None:
            if line.startswith("Type: "):
                current.type_line = line[len("Type: ") :]
            elif line == "Composition and conditional rules":
                current.composition, i = _json_block(body, i + 1)
                continue
            elif line == "Kiln contract annotations":
                current.annotations, i = _json_block(body, i + 1)
                continue
            else:
                row = _FIELD_ROW.match(line)
                if row:
                    current.fields.append(
                        SeedField(
                            name=row["name"],
                            required=row["required"] == "yes",
                            type=row["type"].replace("\\|", "|"),
                            constraints=row["constraints"],
                            description=row["description"],
                        )
                    )
        i += 1
    return Seed(entrypoints, root_composition, root_annotations, definitions)


def load_seed() -> Seed | None:
    path = find_seed()
    if path is None:
        return None
    return parse_seed(path.read_text(encoding="utf-8"))
