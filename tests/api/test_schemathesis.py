"""In-process schemathesis run over every contract route (fixed seed, bounded examples, negative
testing on, every check), against the app wired to the engine test double. The only filter is
the served document's own `x-kiln-rules`, evaluated generically (kiln/fuzz_filter.py)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, Phase, event, settings

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.fuzz_filter import refusal, rules_of
from tests.api.fake_backend import FakeBackend

# The schema is built when the module is imported, so the adapter folder outlives any fixture:
# removed when the test process exits.
_ADAPTERS = Path(tempfile.mkdtemp(prefix="kiln-st-adapters-"))
atexit.register(shutil.rmtree, _ADAPTERS, ignore_errors=True)
for _name in ("style", "math"):
    (_ADAPTERS / _name).mkdir()
    (_ADAPTERS / _name / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
# the training routes on too: their bodies are fuzzed against the contract like the rest
APP = build_app(ServerConfig(enable_weight_updates=True),
                FakeBackend(reply="ok", adapter_dir=_ADAPTERS))
# /inference/v1/generate's sampling_params are /v1/completions' fields, whose rules the served
# document states for completions' top level only: its refusals are tested by
# tests/e2e/test_token_io_http.py instead
schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(
    path="/inference/v1/generate")


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
)
def test_contract_routes(case):
    rule = refusal(rules_of(case.operation.definition.raw), case.body)
    if rule is not None:  # it may break a rule the served document states: the server says 400
        event(f"kept out by x-kiln-rules: {rule['kind']} {rule['param']}")
        return
    event("sent")
    case.call_and_validate()
