"""Reading the generated wire structs' optional fields: a field the body left out is msgspec's
``UNSET``, one it set to null is None."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET


def opt(value: Any) -> Any:
    """UNSET (field missing) and None (explicit null) both mean 'not given' for sampling."""
    return None if value is UNSET else value


def plain(value: Any) -> Any:
    """A wire value (msgspec Struct, UNSET) as plain JSON data (None for UNSET)."""
    return None if value is UNSET else msgspec.to_builtins(value)
