from __future__ import annotations

import pytest

from kiln.model.checkpoint.gguf_tokenizer import tokenizer_from_gguf
from kiln.text import Tokenizer
from tests.tiny_models import default_gguf_metadata, tiny_tokenizer


@pytest.fixture(scope="session")
def tiny_tok() -> Tokenizer:
    tok = tiny_tokenizer()
    eos = tok.token_to_id("<|im_end|>")
    assert eos is not None
    return Tokenizer(tok, eos_token_ids=[eos],
                     eos_token="<|im_end|>")


@pytest.fixture(scope="session")
def smollm_meta() -> dict[str, object]:
    """GGUF metadata of the default model (tokenizer + template; the weights are not read)."""
    return default_gguf_metadata()


@pytest.fixture(scope="session")
def smollm_tok(smollm_meta: dict[str, object]) -> Tokenizer:
    return tokenizer_from_gguf(smollm_meta)
