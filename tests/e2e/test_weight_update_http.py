"""POST /update_weights_from_disk on tiny checkpoints and the default model: after an update the
server answers as a fresh server on the new weights does (token ids and logprobs, greedy and
seeded), reports the new weights' name everywhere, forgets its prefix cache and keeps its
adapters; a request kept across the update reports two spans; a refused checkpoint leaves the
old weights serving. Two tiny qwen3 checkpoints of the same shapes (random weights, seeds 0 and
1) stand for a policy before and after a training step."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.model.checkpoint.locate import default_model_path
from kiln.provenance import base_model_sha256, weight_files
from kiln.serving import EngineBackend
from tests import HANG_S
from tests.model.test_lora import write_peft
from tests.tiny_models import random_tensors, tiny_config, write_tiny_gguf, write_tiny_qwen3

CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "Hello, world! How are you?"}],
                        "max_tokens": 12, "ignore_eos": True, "return_token_ids": True}
GREEDY = {**CHAT, "temperature": 0}
# top_p and top_k given: a folder's generation_config.json would otherwise set them on a fresh
# server, while an update keeps the serving model's sampling defaults (it changes weights only)
SEEDED = {**CHAT, "temperature": 1.0, "seed": 7, "top_p": 1.0, "top_k": -1}
LOGPROBS = {**GREEDY, "logprobs": True, "top_logprobs": 2}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("weights")
    cfg = tiny_config("qwen3")
    a = write_tiny_gguf(d / "a.gguf", cfg, random_tensors(cfg, 0), q8=True)
    b = write_tiny_gguf(d / "b.gguf", cfg, random_tensors(cfg, 1), q8=True)
    other = tiny_config("qwen3", vocab_size=384)  # another shape
    c = write_tiny_gguf(d / "other.gguf", other, random_tensors(other, 1), q8=True)
    cut = d / "truncated.gguf"
    cut.write_bytes(b.read_bytes()[: b.stat().st_size // 2])
    folder = write_tiny_qwen3(d / "b-folder", seed=1)
    folder_a = write_tiny_qwen3(d / "a-folder", seed=0)
    adapters = d / "adapters"
    write_peft(adapters / "ad", cfg, r=4, alpha=8.0, targets=["q_proj", "v_proj"], seed=5)
    return {"a": a, "b": b, "other": c, "truncated": cut, "folder": folder,
            "folder_a": folder_a, "adapters": adapters}


def serve(model: Path | None, **config: Any) -> TestClient:
    cfg = ServerConfig(model=None if model is None else str(model), kv_memory_mb=16,
                       enable_weight_updates=True, **config)
    return TestClient(build_app(cfg, EngineBackend.from_config(cfg)))


@pytest.fixture
def server_a(files: dict[str, Path]) -> Iterator[TestClient]:
    with serve(files["a"], adapter_dir=str(files["adapters"])) as c:
        yield c


def answers(c: TestClient, bodies: list[dict[str, Any]]) -> list[Any]:
    """What a client compares: each choice's token ids, message and logprobs."""
    out = []
    for body in bodies:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        out.append((choice["token_ids"], choice["message"], choice.get("logprobs")))
    return out


def fresh(model: Path, bodies: list[dict[str, Any]], **config: Any) -> list[Any]:
    with serve(model, **config) as c:
        return answers(c, bodies)


def update(c: TestClient, path: Path, **body: Any) -> Any:
    return c.post("/update_weights_from_disk", json={"model_path": str(path), **body})


def version_everywhere(c: TestClient) -> set[str]:
    chat = c.post("/v1/chat/completions", json=GREEDY).json()
    completion = c.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2}).json()
    responses = c.post("/v1/responses", json={"input": "Hello", "max_output_tokens": 2}).json()
    card = c.get("/v1/models").json()["data"][0]
    messages = c.post("/v1/messages", json={"model": card["id"], "max_tokens": 2, "messages": [
        {"role": "user", "content": "Hello"}]}).json()
    return {c.get("/health").json()["weight_version"], card["weight_version"],
            chat["weight_version"], completion["weight_version"],
            responses["weight_version"], messages["weight_version"]}


@pytest.mark.parametrize("mode", ["abort", "wait", "keep"])
def test_update_serves_what_a_fresh_server_on_the_new_weights_serves(
        files: dict[str, Path], server_a: TestClient, mode: str) -> None:
    bodies = [GREEDY, SEEDED, LOGPROBS]
    want = fresh(files["b"], bodies)
    before = answers(server_a, bodies)
    assert [a[0] for a in before] != [w[0] for w in want]  # the two weights differ
    assert version_everywhere(server_a) == {"default"}
    r = update(server_a, files["b"], weight_version="step-1", mode=mode)
    assert r.status_code == 200, r.text
    assert r.json()["success"] is True and r.json()["weight_version"] == "step-1"
    assert r.json()["mode"] == mode
    repeat = server_a.post("/v1/chat/completions", json=GREEDY).json()
    assert repeat["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the cache was flushed
    assert answers(server_a, bodies) == want
    assert version_everywhere(server_a) == {"step-1"}


def test_the_default_name_is_the_content_hash(files: dict[str, Path],
                                              server_a: TestClient) -> None:
    r = update(server_a, files["b"])
    assert r.status_code == 200, r.text
    assert r.json()["weight_version"] == base_model_sha256(weight_files(files["b"]))
    assert r.json()["mode"] == "wait"  # SGLang's default: the running requests finish first


def test_adapters_stay_loaded_and_apply_to_the_new_weights(files: dict[str, Path],
                                                           server_a: TestClient) -> None:
    body = {**GREEDY, "model": "ad"}
    assert server_a.post("/v1/adapters/load", json={"name": "ad"}).status_code == 200
    want = fresh(files["b"], [body], adapter_dir=str(files["adapters"]))
    answers(server_a, [body])
    assert update(server_a, files["b"], mode="abort").status_code == 200
    assert server_a.app.state.kiln.backend.adapter_store.cached("ad") is not None  # type: ignore[attr-defined]
    assert answers(server_a, [body]) == want


def test_an_hf_folder_replaces_a_gguf(files: dict[str, Path], server_a: TestClient) -> None:
    """A folder the torch path runs gets a runner of its own: modes abort and wait only."""
    want = fresh(files["folder"], [GREEDY, SEEDED])
    r = update(server_a, files["folder"], mode="keep")
    assert r.status_code == 400 and "mode abort or wait" in r.json()["error"]["message"]
    assert update(server_a, files["folder"], mode="abort").status_code == 200
    assert answers(server_a, [GREEDY, SEEDED]) == want


def test_a_folder_replaces_a_folder_on_a_torch_model(files: dict[str, Path]) -> None:
    want = fresh(files["folder"], [GREEDY, SEEDED, LOGPROBS])
    with serve(files["folder_a"]) as c:
        assert c.app.state.kiln.backend.engine.executor.program is None  # type: ignore[attr-defined]
        assert answers(c, [GREEDY, SEEDED, LOGPROBS]) != want
        r = update(c, files["folder"], mode="keep")
        assert r.status_code == 200, r.text
        assert answers(c, [GREEDY, SEEDED, LOGPROBS]) == want


@pytest.mark.parametrize(("name", "words"), [
    ("other", "architecture and shapes"), ("truncated", "cannot load"),
    ("missing", "does not exist")])
def test_a_refused_checkpoint_changes_nothing(files: dict[str, Path], server_a: TestClient,
                                             name: str, words: str) -> None:
    want = answers(server_a, [GREEDY])
    path = files.get(name, files["a"].parent / "missing.gguf")
    r = update(server_a, path, weight_version="bad")
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert version_everywhere(server_a) == {"default"}
    assert answers(server_a, [GREEDY]) == want


@pytest.mark.parametrize(("field", "value"), [
    ("flush_cache", False), ("is_async", True), ("token_step", 3), ("load_format", "dummy"),
    ("torch_empty_cache", True), ("manifest", {}), ("unknown_field", 1)])
def test_fields_kiln_cannot_honour_are_refused(files: dict[str, Path], server_a: TestClient,
                                               field: str, value: Any) -> None:
    r = update(server_a, files["b"], **{field: value})
    assert r.status_code == 400, r.text
    assert server_a.get("/health").json()["weight_version"] == "default"


def _running(c: TestClient) -> list[Any]:
    return list(c.app.state.kiln.backend.engine.scheduler._running)  # type: ignore[attr-defined]


def _until(cond: Any) -> None:
    deadline = time.monotonic() + HANG_S  # a hang bound, never a verdict
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


LONG = {**GREEDY, "max_tokens": 1500}


def test_a_kept_request_reports_two_spans(files: dict[str, Path], server_a: TestClient) -> None:
    old = answers(server_a, [LONG])[0][0]  # the old weights' tokens alone
    got: list[Any] = []
    sent = threading.Thread(target=lambda: got.append(
        server_a.post("/v1/chat/completions", json=LONG)))
    sent.start()
    _until(lambda: any(len(st.output_token_ids) >= 4 for st in _running(server_a)))
    assert server_a.post("/pause?mode=keep").json()["running"] == 1  # frozen mid-generation
    r = update(server_a, files["b"], weight_version="v1", mode="keep")
    assert r.status_code == 200 and r.json()["num_paused_requests"] == 1, r.text
    assert server_a.post("/resume").status_code == 200
    sent.join(HANG_S)
    body = got[0].json()
    spans = body["choices"][0]["weight_versions"]
    k = spans[0]["end"]
    assert spans == [{"version": "default", "start": 0, "end": k},
                     {"version": "v1", "start": k, "end": 1500}]
    assert body["weight_version"] == "v1"
    tokens = body["choices"][0]["token_ids"]
    assert 4 <= k < 1500 and tokens[:k] == old[:k]  # the old weights' tokens up to the swap
    assert tokens[k:] != old[k:]  # and the new weights' after it


def test_wait_lets_running_requests_finish_and_a_second_update_is_refused(
        files: dict[str, Path], server_a: TestClient) -> None:
    old = answers(server_a, [LONG])[0][0]
    got: list[Any] = []
    sent = threading.Thread(target=lambda: got.append(
        server_a.post("/v1/chat/completions", json=LONG)))
    sent.start()
    _until(lambda: bool(_running(server_a)))
    server_a.post("/pause?mode=keep")  # the running request holds on until /resume
    first: list[Any] = []
    waiting = threading.Thread(target=lambda: first.append(
        update(server_a, files["b"], weight_version="v1", mode="wait")))
    waiting.start()
    backend = server_a.app.state.kiln.backend  # type: ignore[attr-defined]
    _until(lambda: backend._updating)
    r = update(server_a, files["b"], weight_version="v2")
    assert r.status_code == 409 and "in flight" in r.json()["error"]["message"]
    server_a.post("/resume")
    sent.join(HANG_S)
    waiting.join(HANG_S)
    assert first[0].status_code == 200 and first[0].json()["weight_version"] == "v1"
    body = got[0].json()
    assert body["weight_version"] == "default" and "weight_versions" not in body["choices"][0]
    assert body["choices"][0]["token_ids"] == old  # all made by the old weights


def test_default_model_update_and_provenance(tmp_path: Path) -> None:
    """The default model's file, copied: the same weights under a new name serve the same
    tokens; the name enters /health, the response and the rollout provenance record."""
    copy = shutil.copy(default_model_path(), tmp_path / "policy-step-2.gguf")
    body = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8,
            "temperature": 0, "rollout_provenance": True}
    with serve(None) as c:
        before = c.post("/v1/chat/completions", json=body).json()
        policy = before["choices"][0]["rollout_provenance"]["behavior_policy"]
        assert policy["weight_version"] == "default"
        r = update(c, Path(copy), weight_version="step-2", mode="abort")
        assert r.status_code == 200, r.text
        after = c.post("/v1/chat/completions", json=body).json()
        assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert after["choices"][0]["message"] == before["choices"][0]["message"]
        assert after["weight_version"] == "step-2"
        policy2 = after["choices"][0]["rollout_provenance"]["behavior_policy"]
        assert policy2["weight_version"] == "step-2"
        assert policy2["base_model_sha256"] == policy["base_model_sha256"]  # the same bytes


@pytest.mark.parametrize("handed_over", [False, True], ids=["c-step", "torch"])
def test_sleep_level_2_lets_go_of_the_weights_and_wake_reads_them_again(
        files: dict[str, Path], handed_over: bool) -> None:
    import gc
    import weakref

    with serve(files["a"]) as c:
        backend = c.app.state.kiln.backend  # type: ignore[attr-defined]
        if handed_over:
            answers(c, [LOGPROBS])  # logprobs: the torch runner is built beside the C step
        want = answers(c, [GREEDY, SEEDED])
        old = weakref.ref(backend.engine.executor.model)
        r = c.post("/sleep?level=2")
        assert r.status_code == 200 and r.json()["level"] == 2, r.text
        gc.collect()
        assert old() is None  # nothing holds the model: its memory can go back
        assert c.post("/wake_up").status_code == 200
        assert answers(c, [GREEDY, SEEDED]) == want
        assert c.get("/health").json()["weight_version"] == "default"
