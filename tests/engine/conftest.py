from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.engine.config import EngineConfig
from kiln.engine.loop import AsyncEngine
from kiln.model import LoadedModel, load_model
from tests.tiny_models import default_model, write_tiny_llama


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    folder: Path = write_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))
    return load_model(str(folder), device="cpu")


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    """The embedded default model (SmolLM2-135M-Instruct), loaded once per process."""
    return default_model()


@pytest.fixture(scope="module")
def engine(smollm: LoadedModel) -> Iterator[AsyncEngine]:
    """A threaded engine on the default model (a test module may define its own ``engine``)."""
    eng = AsyncEngine(smollm, EngineConfig(kv_memory_mb=128))
    eng.start()
    yield eng
    eng.shutdown()
