"""GET /ui serves the page and GET /ui/{asset} its own files, offline: every file the page names
is served by the server itself (nothing from elsewhere), with its media type and a
Content-Security-Policy that allows only this server; anything else is a 404 in the envelope.
The page's behaviour in a browser: tests/e2e/test_ui_browser.py."""

from __future__ import annotations

import re
from importlib import resources

import pytest
from starlette.testclient import TestClient

import kiln.ui

STATIC = resources.files(kiln.ui).joinpath("static")


def test_the_page_and_every_file_it_names_are_served(client: TestClient) -> None:
    r = client.get("/ui")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'self'" in r.headers["content-security-policy"]
    named = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert named and all(n.startswith("/ui/") for n in named), named  # no CDN, nothing outside
    kinds = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
    for name in named:
        got = client.get(name)
        assert got.status_code == 200, name
        assert got.headers["content-type"].startswith(kinds[name[name.rfind("."):]]), name
        assert got.content == STATIC.joinpath(name.removeprefix("/ui/")).read_bytes()


def test_the_scripts_fetch_nothing_from_elsewhere() -> None:
    for entry in STATIC.iterdir():
        if entry.name.endswith((".js", ".html", ".css")):
            text = entry.read_text(encoding="utf-8")
            # the only http(s) URL in the page is the Markdown renderer's test for a link target
            assert re.findall(r"https?://[\w.-]+", text) == [], entry.name


@pytest.mark.parametrize("name", ["index.html", "nope.js", "..%2fapp.py", "%2e%2e%2f__init__.py",
                                  "static/app.js", ".hidden.js", "app", "__init__.py"])
def test_anything_else_is_a_404(client: TestClient, name: str) -> None:
    r = client.get(f"/ui/{name}")
    assert r.status_code == 404, name
    assert r.json()["error"]["code"] == "not_found"
