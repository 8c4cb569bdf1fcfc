from __future__ import annotations

import pytest

from kiln.model import LoadedModel
from tests.tiny_models import default_model


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    """The embedded default model (SmolLM2-135M-Instruct), loaded once per process."""
    return default_model()
