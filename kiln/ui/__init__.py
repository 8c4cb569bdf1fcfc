"""The web playground served at /ui (kiln/api/handlers/ui.py): hand-written HTML, CSS and
JavaScript in ``static/``, packaged with kiln (pyproject's package-data), with no build step and
nothing fetched from elsewhere, so the page works offline. ``asset`` is the one way in: a name
of a file in ``static/`` (no folders), its bytes and media type."""

from __future__ import annotations

from importlib import resources

INDEX = "index.html"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def asset(name: str) -> tuple[bytes, str] | None:
    """The file ``name`` of ``static/`` and its media type; None for anything else (a folder, a
    path, a kind of file the page does not have)."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    media = MEDIA_TYPES.get(name[name.rfind("."):]) if "." in name else None
    if media is None:
        return None
    entry = resources.files(__package__).joinpath("static", name)
    if not entry.is_file():
        return None
    return entry.read_bytes(), media
