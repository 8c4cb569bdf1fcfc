"""kiln/model/'s imports, read from the source (``ast``): no import circle among its modules, and
nothing imported from a layer above it.

Every import statement counts: at module level, inside a function (a lazy import) and under
``if TYPE_CHECKING:`` alike, since a reader sees each as an arrow. ``from kiln.model import X``
counts as an import of the module ``kiln/model/__init__.py``'s lazy table names for ``X`` (or of
the submodule ``X``). The package ``__init__`` files Python runs before a submodule are not
counted as arrows of the submodule (kiln/model/__init__.py imports nothing at run time).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = "kiln.model"
# the layers above the model: the engine, the HTTP edge, the backend and what configures them
ABOVE = ("kiln.engine", "kiln.api", "kiln.serving", "kiln.scale", "kiln.cli", "kiln.startup",
         "kiln.config", "kiln.__main__")


def _within(name: str, packages: tuple[str, ...] | str) -> bool:
    packages = (packages,) if isinstance(packages, str) else packages
    return any(name == p or name.startswith(p + ".") for p in packages)


def module_file(name: str) -> Path | None:
    """The source file of a module of this repository (``None``: not one of ours)."""
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def model_modules() -> dict[str, Path]:
    """Every module under kiln/model, packages included, by dotted name."""
    out = {}
    for path in sorted((ROOT / "kiln" / "model").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def lazy_table() -> dict[str, str]:
    """kiln/model/__init__.py's ``_WHERE``: exported name -> module (relative to kiln.model)."""
    tree = ast.parse((ROOT / "kiln" / "model" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_WHERE" for t in node.targets):
            table: dict[str, str] = ast.literal_eval(node.value)
            return table
    raise AssertionError("kiln/model/__init__.py has no _WHERE table")


def imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """``(module, line)`` of every import in ``path`` (the module ``name``), at any depth."""
    table = lazy_table()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                sub = f"{origin}.{alias.name}"
                if module_file(sub) is not None:
                    yield sub, node.lineno
                elif origin == MODEL and alias.name in table:
                    yield f"{MODEL}.{table[alias.name]}", node.lineno
                else:
                    yield origin, node.lineno


def model_graph() -> dict[str, set[str]]:
    """kiln/model's modules and, for each, the kiln/model modules it imports."""
    mods = model_modules()
    return {name: {m for m, _ in imports(name, path) if m in mods and m != name}
            for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_reader_parses_every_kind_of_import() -> None:
    """The graph sees a lazy import, a ``TYPE_CHECKING`` one and the lazy table's names."""
    graph = model_graph()
    assert "kiln.model.base" in graph["kiln.model"]  # CausalLM, through the lazy table
    assert "kiln.model.gguf_loader" in graph["kiln.model.loader"]  # inside load_model


def test_kiln_model_has_no_import_circle() -> None:
    assert cycles(model_graph()) == []


def test_the_cycle_finder_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def closure(name: str) -> set[str]:
    """The kiln modules ``name`` imports, directly or through others (any import statement),
    with the packages Python runs on the way (``kiln/text/__init__.py`` for kiln.text.x)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        parts = mod.split(".")
        todo += [".".join(parts[:i]) for i in range(2, len(parts))]
        path = module_file(mod)
        if path is not None:
            todo += [m for m, _ in imports(mod, path) if _within(m, ("kiln", "kiln_kernels"))]
    return seen - {name, "kiln"}


def test_kiln_model_imports_nothing_above_it() -> None:
    """What kiln/model imports from the rest of kiln is beside or below it: modules that import,
    even through others, neither kiln.model nor the engine, the HTTP edge, the backend or the
    server's configuration."""
    beside: set[str] = set()
    for name, path in model_modules().items():
        for mod, line in imports(name, path):
            if _within(mod, "kiln") and not _within(mod, MODEL):
                assert not _within(mod, ABOVE), f"{path.relative_to(ROOT)}:{line} imports {mod}"
                beside.add(mod)
    assert "kiln.text.tokenizer" in beside  # the reader sees them
    for mod in sorted(beside):
        bad = sorted(m for m in closure(mod) if _within(m, (MODEL, *ABOVE)))
        assert bad == [], f"{mod}, which kiln/model imports, imports {bad}"


# the torch-free folders, each with the kiln/model folders it may import
# (tests/test_import_boundaries.py imports each of their modules in a fresh process)
TORCH_FREE = {"kiln.model.checkpoint": ("kiln.model.checkpoint",),
              "kiln.model.native": ("kiln.model.native", "kiln.model.checkpoint")}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """The lines of ``if TYPE_CHECKING:`` bodies (imports for annotations, never run)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def test_the_torch_free_folders_import_no_torch_and_nothing_of_the_torch_side() -> None:
    """No module under kiln/model/checkpoint/ or kiln/model/native/ imports torch or triton
    where it runs (only under TYPE_CHECKING, for annotations), at module level or in a
    function, nor any kiln.model module outside the folders it may read."""
    problems = []
    found = set()
    for name, path in model_modules().items():
        folder = next((f for f in TORCH_FREE if _within(name, f)), None)
        if folder is None:
            continue
        found.add(folder)
        typing_only = _type_checking_lines(ast.parse(path.read_text()))
        for mod, line in imports(name, path):
            where = f"{path.relative_to(ROOT)}:{line} imports {mod}"
            if _within(mod, ("torch", "triton")) and line not in typing_only:
                problems.append(where)
            if _within(mod, MODEL) and mod != MODEL and not _within(mod, TORCH_FREE[folder]):
                problems.append(where)
    assert found == set(TORCH_FREE)
    assert problems == []
