"""Content hashes and rollout provenance records (docs/behavior.md §7).

Everything here is pure Python (no torch): the hashes are over files, token vocabularies,
template sources and canonical JSON, so they are equal across restarts and change exactly when
the content they name changes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASE_MODEL_DOMAIN = b"kiln.base-model-content.v1"
VOCAB_DOMAIN = b"kiln.tokenizer-vocab.v1"
INFERENCE_CONFIG_SCHEMA = "kiln-python.inference-config.v1"
PROVENANCE_SCHEMA = "kiln.rollout-provenance.v1"
SCORED_PAYLOAD_SCHEMA = "kiln.scored-rollout-payload.v1"
_CHUNK = 1 << 20


def sha256_prefixed(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def compact_json(value: Any, *, sort_keys: bool = False) -> bytes:
    return json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys, allow_nan=False
    ).encode("utf-8")


def file_digest(path: Path) -> tuple[bytes, int]:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.digest(), size


def weight_files(source: Path) -> list[Path]:
    """The files holding a model's weights: every *.safetensors shard of an HF folder, or the
    GGUF file itself."""
    if source.is_dir():
        return sorted(source.glob("*.safetensors"))
    return [source]


def base_model_sha256(files: Iterable[Path]) -> str:
    """`kiln.base-model-content.v1`: records (sha256, size) per weight file, sorted by digest then
    size; hash the domain, a NUL, the u64-LE count, then per record u64-LE size + raw digest.
    File names and paths do not matter."""
    records = sorted(file_digest(p) for p in files)
    h = hashlib.sha256(BASE_MODEL_DOMAIN + b"\0" + struct.pack("<Q", len(records)))
    for digest, size in records:
        h.update(struct.pack("<Q", size) + digest)
    return "sha256:" + h.hexdigest()


def vocab_sha256(vocab: Mapping[str, int]) -> str:
    """`kiln.tokenizer-vocab.v1`: domain + NUL, then every (id, token) pair sorted by (id, bytes),
    each framed as u32-LE id, u32-LE byte length, UTF-8 bytes (this port's framing; the original's
    was not published)."""
    pairs = sorted((i, tok.encode("utf-8")) for tok, i in vocab.items())
    h = hashlib.sha256(VOCAB_DOMAIN + b"\0" + struct.pack("<I", len(pairs)))
    for token_id, raw in pairs:
        h.update(struct.pack("<II", token_id, len(raw)) + raw)
    return "sha256:" + h.hexdigest()


def message_record(message: Mapping[str, Any]) -> dict[str, Any]:
    """A request message in Kiln's ChatMessage field order (role, content, tool_calls?, name?,
    tool_call_id?); nested tool-call objects get sorted keys."""
    out: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = json.loads(compact_json(calls, sort_keys=True))
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def prompt_messages_sha256(messages: Sequence[Mapping[str, Any]]) -> str:
    return sha256_prefixed(compact_json([message_record(m) for m in messages]))


def scored_payload_sha256(text: str) -> str:
    payload = {"schema": SCORED_PAYLOAD_SCHEMA, "text": text, "trajectory": []}
    return sha256_prefixed(compact_json(payload))


def inference_config_sha256(model_config: Mapping[str, Any], backend: str, runtime: str) -> str:
    """This implementation's inference policy: model config, backend, runtime versions and the
    scoring/sampling semantics it applies."""
    doc = {
        "schema": INFERENCE_CONFIG_SCHEMA,
        "model_config": dict(model_config),
        "backend": backend,
        "runtime": runtime,
        "sampling_semantics": "penalties>temperature>top_k>min_p>top_p>counter-hash gumbel-max",
        "logprob_semantics": "log_softmax of float32 logits; behavior logprob post-filter",
        "hard_caps": {"max_top_k": 256, "max_prompt_tokens": 4096,
                      "max_response_candidates": 65536},
    }
    return sha256_prefixed(compact_json(doc, sort_keys=True))


def adapter_identity(lora: Sequence[tuple[Any, float]]) -> dict[str, str] | None:
    """{name, content_sha256} of an adapter mix: one adapter at scale 1 as itself; a composition
    as a name listing its parts and a hash over (content hash, scale) pairs."""
    if not lora:
        return None
    parts = [(str(getattr(a, "name", a)), str(getattr(a, "content_sha256", a)), s) for a, s in lora]
    if len(parts) == 1 and parts[0][2] == 1.0:
        name, sha, _ = parts[0]
        return {"name": name, "content_sha256": sha if sha.startswith("sha256:") else "sha256:" + sha}
    composite = [{"content_sha256": sha, "scale": scale} for _, sha, scale in sorted(parts, key=lambda p: p[1])]
    return {
        "name": "+".join(f"{name}*{scale:g}" for name, _, scale in parts),
        "content_sha256": sha256_prefixed(compact_json(composite)),
    }


@dataclass(frozen=True)
class PolicyIdentity:
    """What the server knows about the policy it serves (computed once per process)."""

    served_model_id: str
    base_model_sha256: str
    inference_config_sha256: str
    implementation: str
    vocab_sha256: str
    tokenizer_config_sha256: str
    chat_template_sha256: str
    generation_backend: str


@dataclass(frozen=True)
class ActionToken:
    token_id: int
    logprob: float | None  # None for a forced token


def rollout_record(
    *,
    identity: PolicyIdentity,
    prompt_ids: Sequence[int],
    actions: Sequence[ActionToken],
    messages: Sequence[Mapping[str, Any]],
    final_content: str,
    sampling: Mapping[str, Any],
    seed: int,
    adapter: Mapping[str, str] | None = None,
    template_invocation: Mapping[str, Any] | None = None,
    weight_version: str | None = None,
    weight_versions: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A RolloutProvenanceV1 record in the contract's field order. ``weight_version``: the
    name of the weights that made the last action token; ``weight_versions``: every span, given
    only when the rollout ran across a weight update (two or more)."""
    n = len(prompt_ids)
    policy: dict[str, Any] = {
        "served_model_id": identity.served_model_id,
        "base_model_sha256": identity.base_model_sha256,
    }
    if adapter is not None:
        policy["adapter"] = dict(adapter)
    policy["inference_config_sha256"] = identity.inference_config_sha256
    policy["implementation"] = identity.implementation
    if weight_version is not None:
        policy["weight_version"] = weight_version
    if len(weight_versions) > 1:
        policy["weight_versions"] = [dict(span) for span in weight_versions]
    record: dict[str, Any] = {
        "schema": PROVENANCE_SCHEMA,
        "input_token_ids": [*prompt_ids, *(a.token_id for a in actions)],
        "prompt_token_count": n,
        "prompt_messages_sha256": prompt_messages_sha256(messages),
        "scored_payload_sha256": scored_payload_sha256(final_content),
        "action_tokens": [
            {
                "sequence_index": n + i,
                "token_id": a.token_id,
                "source": "forced" if a.logprob is None else "sampled",
                "behavior_logprob": None if a.logprob is None else min(float(a.logprob), 0.0),
            }
            for i, a in enumerate(actions)
        ],
        "behavior_policy": policy,
        "tokenizer": {
            "vocab_sha256": identity.vocab_sha256,
            "config_sha256": identity.tokenizer_config_sha256,
            "chat_template_sha256": identity.chat_template_sha256,
        },
    }
    if template_invocation:
        record["template_invocation"] = dict(template_invocation)
    record["sampling"] = dict(sampling)
    record["seed"] = int(seed)
    record["generation_backend"] = identity.generation_backend
    return record


def semantic_problems(record: Mapping[str, Any]) -> list[str]:
    """The RolloutProvenanceV1 semantic constraints the contract states in prose."""
    problems = []
    ids = record["input_token_ids"]
    n = record["prompt_token_count"]
    actions = record["action_tokens"]
    if n > len(ids):
        problems.append("prompt_token_count > len(input_token_ids)")
    indices = [a["sequence_index"] for a in actions]
    if any(b <= a for a, b in itertools.pairwise(indices)) or (
        indices and indices[0] < n
    ):
        problems.append("sequence_index values must increase and index generated tokens")
    if any(i >= len(ids) or ids[i] != a["token_id"] for i, a in zip(indices, actions, strict=True)):
        problems.append("action token_id != input_token_ids[sequence_index]")
    if not any(a["source"] == "sampled" for a in actions):
        problems.append("no sampled action token")
    close = (record["sampling"].get("thinking_budget") or {}).get("close_token_ids", [])
    if any(a["source"] == "forced" and a["token_id"] not in close for a in actions):
        problems.append("forced token outside close_token_ids")
    if sum(len(s.encode()) for s in record["sampling"]["stop"]) > 16384:
        problems.append("stop sequences exceed 16384 bytes")
    invocation = record.get("template_invocation")
    if invocation is not None and len(compact_json(invocation)) > 1_048_576:
        problems.append("template_invocation over 1 MiB")
    return problems


def kiln_version() -> str:
    """The installed kiln package's version (``0+unknown`` when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kiln")
    except PackageNotFoundError:
        return "0+unknown"


def content_identity(model_config: Mapping[str, Any], tokenizer_config_sha256: str,
                     chat_template: str) -> dict[str, str]:
    """The hashes that fingerprint a served model: its tokenizer's special-token configuration
    (the hex digest the tokenizer gives), its chat template's source and its model config."""
    return {
        "tokenizer_config_hash": sha256_prefixed(tokenizer_config_sha256.encode()),
        "chat_template_hash": sha256_prefixed(chat_template.encode()),
        "model_config_hash": sha256_prefixed(json.dumps(dict(model_config),
                                                        sort_keys=True).encode()),
    }


def policy_identity(*, served_model_id: str, source: Path, model_config: Mapping[str, Any],
                    dtype: str, kv_cache_dtype: str, backend: str, runtime: str,
                    vocab: Callable[[], Mapping[str, int]], tokenizer_json: Callable[[], str],
                    chat_template: str) -> PolicyIdentity | None:
    """The policy identity of a model loaded from ``source`` (None when that is not a path
    here, e.g. the embedded default model): hashing its weight files takes a moment (about
    0.56 GB/s on a 2-core CPU). ``vocab`` and ``tokenizer_json`` are called only when needed."""
    if not source.exists():
        return None
    model_cfg: dict[str, Any] = {**model_config, "dtype": dtype}
    if kv_cache_dtype != "auto":  # it changes the numbers; auto keeps old hashes
        model_cfg["kv_cache_dtype"] = kv_cache_dtype
    return PolicyIdentity(
        served_model_id=served_model_id,
        base_model_sha256=base_model_sha256(weight_files(source)),
        inference_config_sha256=inference_config_sha256(model_cfg, backend, runtime),
        implementation=f"kiln-python/{kiln_version()}/{backend}/{runtime}",
        vocab_sha256=vocab_sha256(vocab()),
        tokenizer_config_sha256=sha256_prefixed(tokenizer_json().encode()),
        chat_template_sha256=sha256_prefixed(chat_template.encode()),
        generation_backend=backend,
    )
