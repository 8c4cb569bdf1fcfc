"""Run datamodel-code-generator (pinned 0.89.0) over the codegen view to produce msgspec structs."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from codegen.paths import Layout, banner
from codegen.view import write_view

DCG_VERSION = "0.89.0"

# One reason per flag. "Explicit" flags change nothing with 0.89.0 and stay so that a newer
# generator cannot silently change the output.
DCG_FLAGS = (
    "--input-file-type", "jsonschema",  # the contract is JSON Schema 2020-12, not OpenAPI
    "--output-model-type", "msgspec.Struct",  # the edge decodes with msgspec
    "--target-python-version", "3.11",  # the oldest Python the package supports
    "--use-annotated",  # explicit: constraints as Annotated[..., Meta(...)]
    "--field-constraints",  # explicit: bounds and patterns on the field, checked on decode
    "--use-union-operator",  # explicit: `X | None`, not Optional[X]
    "--collapse-root-models",  # inline the Nullable* aliases instead of one class each
    "--enum-field-as-literal", "all",  # Literal[...] instead of Enum classes
    "--use-msgspec-tagged-unions",  # explicit: a const discriminator becomes a tagged union
    "--use-tag-as-union-variant-name",  # variants named ...Sampled/...Forced, not ...V11/...V12
    "--use-schema-description",  # the contract's descriptions become docstrings
    "--keyword-only",  # kw_only=True: hand-written code builds structs by keyword
    "--skip-root-model",  # the root oneOf over entrypoints would be an undecodable alias
    "--no-allow-remote-refs",  # a sibling file is never fetched from its $id URL
    "--strict-refs",  # an unresolved $ref fails instead of becoming Any
    "--disable-timestamp",  # byte-identical output, so check-generated can compare bytes
    "--enable-version-header",  # the header names the generator version (output may differ)
    "--formatters", "builtin",  # no black/isort: output independent of their versions
)  # fmt: skip

# Warnings datamodel-code-generator is allowed to print; anything else fails generation.
ALLOWED_WARNINGS = ("64-bit range", "uint64", "Meta takes the number constraints")


class GenerationError(RuntimeError):
    """datamodel-code-generator failed or warned about something new."""


def _check_version() -> None:
    from importlib.metadata import version

    found = version("datamodel-code-generator")
    if found != DCG_VERSION:
        raise GenerationError(f"datamodel-code-generator {DCG_VERSION} required, found {found}")


def _unexpected_warnings(stderr: str) -> list[str]:
    bad = []
    for line in stderr.splitlines():
        text = line.strip()
        # warnings print as "<file>:<line>: <Category>Warning: <message>", then the source line
        if "Warning:" not in text:
            continue
        if not any(ok in text for ok in ALLOWED_WARNINGS):
            bad.append(text)
    return bad


def render_wire(layout: Layout, digest: str) -> str:
    _check_version()
    with tempfile.TemporaryDirectory(prefix="kiln-codegen-") as tmp:
        view = Path(tmp) / "view"
        closed = write_view(layout.contract_files(), view)
        out = Path(tmp) / "wire.py"
        cmd = [
            sys.executable, "-m", "datamodel_code_generator",
            "--input", str(view / layout.main_schema.name),
            "--output", str(out),
            "--extra-template-data", str(closed),
            *DCG_FLAGS,
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tmp)
        if proc.returncode != 0:
            raise GenerationError(f"datamodel-codegen failed:\n{proc.stderr}")
        bad = _unexpected_warnings(proc.stderr)
        if bad:
            raise GenerationError("unexpected datamodel-codegen warnings:\n" + "\n".join(bad))
        body = out.read_text(encoding="utf-8")
    body = body.replace(str(view) + "/", "")
    return banner(digest) + body
