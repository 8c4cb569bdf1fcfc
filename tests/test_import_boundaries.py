"""docs/architecture.md's import boundaries, checked by importing each module in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CASES = [
    # (module, forbidden top-level packages)
    ("kiln.api.app", ("torch", "triton", "kiln.model", "kiln.engine.runner", "kiln.engine.loop")),
    ("kiln.api.handlers.chat", ("torch", "triton")),
    ("kiln.engine.scheduler", ("torch", "triton")),
    ("kiln.engine.request", ("torch", "triton")),
    ("kiln.engine.block_pool", ("torch", "triton")),
    ("kiln_kernels", ("kiln",)),
    ("kiln_kernels.sampling", ("kiln",)),
    ("kiln_kernels.attention", ("kiln",)),
    ("kiln_kernels.lora", ("kiln",)),
    ("kiln_kernels.quant", ("kiln",)),
    ("kiln_kernels.cpu", ("kiln",)),
    ("kiln_kernels.cpu.cpu_step", ("kiln",)),
    # random GGML blocks for tests and benches: neither tests nor bench may be imported from it
    ("kiln_kernels.testing", ("kiln", "tests", "bench")),
    ("codegen.__main__", ("kiln",)),
    # ray is an optional extra: only kiln.scale.ray_serve may import it
    ("kiln.cli", ("ray",)),
    ("kiln.serving", ("ray",)),
    ("kiln.scale.asgi_bridge", ("ray", "torch")),
    ("kiln.scale.routing", ("ray", "torch")),
    ("kiln_kernels.tiling", ("kiln", "torch", "triton")),
    # kiln serve's torch-free C engine (a GGUF the CPU step runs whole): everything it imports
    # to load the model and serve plain requests (kiln/engine/runner.py over a C model)
    ("kiln.cli", ("torch", "triton")),
    ("kiln.serving", ("torch", "triton")),
    ("kiln.engine.loop", ("torch", "triton")),
    ("kiln.engine.runner", ("torch", "triton")),
    ("kiln.engine.logit_rows", ("torch", "triton")),
    ("kiln.engine.core", ("torch", "triton")),
    ("kiln.model.loader", ("torch", "triton")),
    ("kiln.resident", ("torch", "triton")),
    ("kiln.api.app", ("torch", "triton")),
    ("kiln.connections", ("torch", "triton")),
    ("kiln_kernels.cpu.cpu_step", ("torch", "triton")),
    ("kiln_kernels.quant", ("torch", "triton")),
    ("kiln_kernels.sampling.native", ("torch", "triton")),
    ("kiln_kernels.grammar.native", ("torch", "triton")),
    ("bench.bench_peer", ("torch", "triton")),
    ("bench.bench_startup", ("torch", "triton")),
    # the live-server helper for tests and benches: the standard library only
    ("kiln.testing", ("httpx", "torch", "kiln.api", "kiln.engine", "kiln.model", "kiln.config")),
]


ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "kiln" / "model"
# kiln/model's torch-free part is two folders, each module in them torch-free by where it lies:
# what benches and tests read of a model without loading it (no torch, whose libraries the
# reading process would otherwise share with a server it measures: kiln/resident.py), what
# start-up tiles on a thread while the main thread imports torch (native/early_tiles.py), and
# everything `kiln serve`'s torch-free C engine loads the model with (native/c_model.py).
# A folder may import itself and the folders before it here (native/ reads checkpoint/'s
# files), nothing else of kiln.model (tests/model/test_model_imports.py reads every import).
TORCH_FREE = ("checkpoint", "native")


def _modules(folder: Path) -> list[str]:
    names = []
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def torch_free_cases() -> list[tuple[str, tuple[str, ...]]]:
    """Each module of the torch-free folders, with torch, triton and every kiln.model module
    outside the folders it may import (the torch side: kiln/model/*.py) forbidden."""
    torch_side = tuple(f"kiln.model.{p.stem}" for p in sorted(MODEL.glob("*.py"))
                       if p.stem != "__init__")
    cases = []
    for i, folder in enumerate(TORCH_FREE):
        later = tuple(f"kiln.model.{f}" for f in TORCH_FREE[i + 1:])
        cases += [(m, ("torch", "triton", *torch_side, *later))
                  for m in _modules(MODEL / folder)]
    return cases


def test_the_torch_free_folders_hold_what_they_did() -> None:
    """The folders hold the modules the old list named one by one (and their packages)."""
    names = {m for m, _ in torch_free_cases()}
    assert {"kiln.model.checkpoint.locate", "kiln.model.checkpoint.gguf_index",
            "kiln.model.native.early_tiles", "kiln.model.checkpoint.gguf_tensors",
            "kiln.model.checkpoint.hf_tensors", "kiln.model.native.c_model",
            "kiln.model.native.step_weights", "kiln.model.checkpoint.rope",
            "kiln.model.native.plan"} < names
    forbidden = dict(torch_free_cases())["kiln.model.checkpoint.locate"]
    assert "kiln.model.base" in forbidden and "kiln.model.native" in forbidden


@pytest.mark.parametrize(("module", "forbidden"), CASES + torch_free_cases())
def test_import_boundary(module: str, forbidden: tuple[str, ...]) -> None:
    code = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        f"bad = [m for m in sys.modules if any(m == f or m.startswith(f + '.') for f in {forbidden!r})]\n"
        "print(','.join(sorted(bad)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"


def test_engine_never_imports_api() -> None:
    """The engine sits below the HTTP edge: importing every kiln.engine module loads no kiln.api
    module (the edge imports the engine's records, never the other way round)."""
    engine_dir = Path(__file__).resolve().parents[1] / "kiln" / "engine"
    modules = sorted(f"kiln.engine.{p.stem}" for p in engine_dir.glob("*.py")
                     if p.stem != "__init__")
    assert "kiln.engine.loop" in modules and "kiln.engine.scoring" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(','.join(sorted(m for m in sys.modules if m == 'kiln.api' "
        "or m.startswith('kiln.api.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"kiln.engine imports {out.stdout.strip()}"


def test_no_serving_module_imports_the_test_helper() -> None:
    """kiln.testing starts servers, kiln.fuzz_filter filters fuzz cases and kiln_kernels.testing
    makes random GGML blocks, for tests and benches; `kiln serve` loads none of them."""
    code = ("import sys, kiln.cli, kiln.serving, kiln.api.app\n"
            "print('kiln.testing' in sys.modules, 'kiln.fuzz_filter' in sys.modules,\n"
            "      'kiln_kernels.testing' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False False"


def test_a_cpu_server_never_imports_triton() -> None:
    """On the CPU (C step, C sampler) nothing needs Triton, whose library is 66 MiB of resident
    memory once imported: loading the default model, building the engine and app and serving a
    chat request leave it unimported."""
    from kiln_kernels.cpu import available

    if not available():
        pytest.skip("no C compiler: no C step or C sampler to serve with")
    code = ("import sys\n"
            "from starlette.testclient import TestClient\n"
            "from kiln.api.app import build_app\n"
            "from kiln.config import ServerConfig\n"
            "from kiln.model import load_model\n"
            "from kiln.serving import EngineBackend\n"
            "cfg = ServerConfig()\n"
            "loaded = load_model(None)\n"
            "with TestClient(build_app(cfg, EngineBackend(loaded, cfg))) as c:\n"
            "    r = c.post('/v1/chat/completions', json={'model': loaded.served_name,\n"
            "               'messages': [{'role': 'user', 'content': 'Hi'}], 'max_tokens': 3})\n"
            "    assert r.status_code == 200, r.text\n"
            "print('triton' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_model_package_names_every_lazy_export() -> None:
    """kiln.model's ``__all__`` and the table its ``__getattr__`` reads agree, and each name
    resolves to the object of the module the table names."""
    import importlib

    import kiln.model as pkg

    table = pkg._WHERE
    assert sorted(pkg.__all__) == sorted(table)
    for name, module in table.items():
        assert getattr(pkg, name) is getattr(importlib.import_module(f"kiln.model.{module}"), name)
    with pytest.raises(AttributeError):
        _ = pkg.no_such_name
