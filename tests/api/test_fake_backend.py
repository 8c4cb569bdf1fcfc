"""The fake backend stands in for the real one: `make lint` (mypy over tests/) checks it against
the `Backend` protocol at the typed assignment below, and this test checks at run time that it
has every member the protocol names."""

from __future__ import annotations

from kiln.api.backend import Backend
from tests.api.fake_backend import FakeBackend


def test_the_fake_backend_is_a_backend() -> None:
    backend: Backend = FakeBackend()  # mypy: FakeBackend satisfies the protocol
    members = [name for name in vars(Backend) if not name.startswith("_")]
    assert "submit" in members and "model_id" in members
    assert [name for name in members if not hasattr(backend, name)] == []
