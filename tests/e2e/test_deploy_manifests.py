"""deploy/kubernetes parses, its pieces agree with each other, and every metric it names is one
that a live `kiln serve`'s /metrics really exports (with the labels the picker reads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml

from tests import HANG_S
from tests.e2e.conftest import LiveServer

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
METRIC_FLAGS = ("--total-queued-requests-metric", "--total-running-requests-metric",
                "--kv-cache-usage-percentage-metric", "--lora-info-metric", "--cache-info-metric")


def _docs() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def _args(container: dict[str, Any]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in container.get("args", []) if "=" in a)


def test_the_pieces_agree() -> None:
    docs = _docs()
    pool = docs[("InferencePool", "kiln")]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    kiln = docs[("Deployment", "kiln")]
    pod = kiln["spec"]["template"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (server,) = pod["spec"]["containers"]
    port = int(_args(server)["--port"])
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [port]
    assert server["ports"][0]["containerPort"] == port
    for probe in ("readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/health", "port": port}
    assert pod["spec"]["terminationGracePeriodSeconds"] > float(_args(server)["--drain-timeout-s"])
    epp = docs[("Deployment", pool["spec"]["endpointPickerRef"]["name"])]
    (picker,) = epp["spec"]["template"]["spec"]["containers"]
    assert _args(picker)["--pool-name"] == pool["metadata"]["name"]
    assert int(_args(picker)["--grpc-port"]) == pool["spec"]["endpointPickerRef"]["port"]["number"]
    config = yaml.safe_load(docs[("ConfigMap", "kiln-epp-config")]["data"]["config.yaml"])
    assert config["kind"] == "EndpointPickerConfig"
    declared = {p["type"] for p in config["plugins"]}
    used = {p["pluginRef"] for prof in config["schedulingProfiles"] for p in prof["plugins"]}
    assert used <= declared


def test_every_metric_the_picker_reads_is_exported(live_server: LiveServer) -> None:
    docs = _docs()
    (picker,) = docs[("Deployment", "kiln-epp")]["spec"]["template"]["spec"]["containers"]
    wanted = {_args(picker)[flag] for flag in METRIC_FLAGS}
    text = httpx.get(live_server.url + "/metrics", timeout=HANG_S).text
    exported = {line.split("{")[0].split()[0] for line in text.splitlines()
                if line and not line.startswith("#")}
    assert wanted <= exported, wanted - exported
    lines = {line.split("{")[0]: line for line in text.splitlines() if line.startswith("vllm:")}
    cache = lines["vllm:cache_config_info"]
    assert 'block_size="16"' in cache and "num_gpu_blocks=" in cache
    lora = lines["vllm:lora_requests_info"]
    assert "running_lora_adapters=" in lora and "max_lora=" in lora
