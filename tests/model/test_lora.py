"""LoRA: PEFT loading and validation, and batched multi-adapter application equal to merged
weights (single adapters, compositions, mixed batches, LRU eviction)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from kiln.adapters import AdapterStore
from kiln.model import CausalLM, KVCache, ModelConfig, build_forward_batch
from kiln.model.float32_copies import packed_disabled
from kiln.model.lora import (
    LORA_MODULES,
    AdapterLoadError,
    LoraAdapter,
    adapter_from_state,
    load_adapter,
    module_shape,
)
from kiln.model.lora_slots import AdapterSlots, LoraBatch, LoraCapacityError, Strategy
from tests.numerics import assert_logits_close, reorder_rtol
from tests.tiny_models import model_from_tensors, random_tensors, tiny_config

BLOCK = 4
Mix = list[tuple[LoraAdapter, float]]


def write_peft(folder: Path, cfg: ModelConfig, *, r: int, alpha: float, targets: Sequence[str],
               seed: int, prefix: bool = True, rslora: bool = False,
               layers: Sequence[int] | None = None) -> Path:
    """A random PEFT adapter folder (B is non-zero, unlike a fresh PEFT init)."""
    gen = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(cfg.num_layers) if layers is None else layers:
        for mod in targets:
            n_in, n_out = module_shape(cfg, mod)
            group = "self_attn" if mod.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            key = f"{'base_model.model.' if prefix else ''}model.layers.{layer}.{group}.{mod}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(r, n_in, generator=gen) / n_in ** 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, r, generator=gen) * 0.4 / r ** 0.5
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": list(targets),
              "use_rslora": rslora, "bias": "none", "task_type": "CAUSAL_LM"}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def merged(cfg: ModelConfig, base: dict[str, torch.Tensor], mix: Mix) -> CausalLM:
    """A plain model whose weights are W + sum scale * (alpha/r) * B @ A (computed here, from
    the raw tensors, independent of the adapter's own scaling code)."""
    w = {k: v.clone() for k, v in base.items()}
    for adapter, scale in mix:
        s = adapter.alpha / (math.sqrt(adapter.rank) if adapter.use_rslora else adapter.rank)
        for (layer, mod), (a, b) in adapter.weights.items():
            group = "self_attn" if mod in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            w[f"model.layers.{layer}.{group}.{mod}.weight"] += scale * s * (b @ a)
    return model_from_tensors(cfg, w)


def run(model: CausalLM, cfg: ModelConfig, seqs: list[list[int]], mixes: list[Mix] | None,
        slots: AdapterSlots | None = None, decode_steps: int = 2) -> list[torch.Tensor]:
    """Prefill every sequence in one batch (logits for all rows), then decode ``decode_steps``
    batched tokens; returns logits [len, vocab] per sequence."""
    kv = KVCache(cfg, num_blocks=64, block_size=BLOCK, dtype=torch.float32,
                 device=torch.device("cpu"))
    tables = [list(range(1 + 12 * i, 13 + 12 * i)) for i in range(len(seqs))]
    out: list[list[torch.Tensor]] = [[] for _ in seqs]
    prompt = [len(s) - decode_steps for s in seqs]
    steps = [[(s[:p], 0, t) for s, p, t in zip(seqs, prompt, tables, strict=True)]]
    for d in range(decode_steps):
        steps.append([(s[p + d:p + d + 1], p + d, t)
                      for s, p, t in zip(seqs, prompt, tables, strict=True)])
    for step in steps:
        batch = build_forward_batch(step, BLOCK, logits="all")
        lb = None
        if mixes is not None:
            assert slots is not None
            lb = LoraBatch.build(mixes, [len(new) for new, _, _ in step], slots)
            batch.lora = lb
        logits = model(batch, kv)
        if lb is not None:
            lb.release()
        row = 0
        for i, (new, _, _) in enumerate(step):
            out[i].append(logits[row:row + len(new)])
            row += len(new)
    return [torch.cat(o) for o in out]


@pytest.fixture(params=["qwen3", "llama"])
def setup(request: pytest.FixtureRequest, tmp_path: Path
          ) -> tuple[ModelConfig, dict[str, torch.Tensor], CausalLM, LoraAdapter, LoraAdapter]:
    arch = request.param
    cfg = tiny_config(arch, tie=arch == "llama")
    base = random_tensors(cfg, seed=5)
    a = load_adapter(write_peft(tmp_path / "a", cfg, r=4, alpha=8, targets=LORA_MODULES,
                                seed=1), cfg)
    b = load_adapter(write_peft(tmp_path / "b", cfg, r=8, alpha=4,
                                targets=("q_proj", "v_proj", "down_proj"), seed=2, prefix=False,
                                rslora=arch == "llama", layers=[1]), cfg)
    return cfg, base, model_from_tensors(cfg, base), a, b


def _seqs(cfg: ModelConfig, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(cfg.vocab_size) for _ in range(7 + 3 * i)] for i in range(n)]


LORA_CONTEXT = 64  # past every sequence here (7 + 3 * i tokens, a few decodes)


TINY = tiny_config("llama")  # every setup here has its shapes (the architectures differ only
# in q/k norm, which adds no sum longer than these)


def _close(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor],
           cfg: ModelConfig = TINY) -> None:
    """Logits with an adapter applied as x @ A @ B against merged weights W + s * B @ A: both
    float32, they differ in the order of the sums (the rank's few terms sit well inside the
    forward bound's margin) and in the one rounding of each merged weight."""
    for g, w in zip(got, want, strict=True):
        assert_logits_close(g, w, cfg, LORA_CONTEXT)


def test_single_adapter_equals_merged(setup: tuple[ModelConfig, dict[str, torch.Tensor],
                                                   CausalLM, LoraAdapter, LoraAdapter]) -> None:
    cfg, base, model, a, b = setup
    seqs = _seqs(cfg, 3)
    slots = AdapterSlots(cfg, max_slots=4)
    for adapter, scale in ((a, 0.7), (b, 1.0)):
        mix = [(adapter, scale)]
        want = run(merged(cfg, base, mix), cfg, seqs, None)
        got = run(model, cfg, seqs, [mix] * 3, slots)
        _close(got, want)
        assert (want[0] - run(model, cfg, seqs, None)[0]).abs().max() > 1e-2  # adapter matters


def test_composition_and_scale_zero(setup: tuple[ModelConfig, dict[str, torch.Tensor],
                                                 CausalLM, LoraAdapter, LoraAdapter]) -> None:
    cfg, base, model, a, b = setup
    seqs = _seqs(cfg, 2, seed=1)
    slots = AdapterSlots(cfg, max_slots=4)
    mix: Mix = [(a, 0.5), (b, -1.2)]
    _close(run(model, cfg, seqs, [mix, mix], slots), run(merged(cfg, base, mix), cfg, seqs, None))
    _close(run(model, cfg, seqs, [[(a, 0.0)], [(a, 0.0), (b, 0.0)]], slots),
           run(model, cfg, seqs, None))


def test_mixed_batch_rows_equal_solo(setup: tuple[ModelConfig, dict[str, torch.Tensor],
                                                  CausalLM, LoraAdapter, LoraAdapter]) -> None:
    cfg, base, model, a, b = setup
    seqs = _seqs(cfg, 5, seed=2)
    mixes: list[Mix] = [[], [(a, 1.0)], [(b, 0.8)], [(a, 0.3), (b, 1.5)], [(b, 1.5), (a, 0.3)]]
    slots = AdapterSlots(cfg, max_slots=2)
    got = run(model, cfg, seqs, mixes, slots)
    for i, mix in enumerate(mixes):
        solo = run(model, cfg, [seqs[i]], [mix], slots)[0]
        ref = run(merged(cfg, base, mix), cfg, [seqs[i]], None)[0]
        _close([got[i], solo], [ref, ref])


def test_lru_eviction_keeps_results_correct(tmp_path: Path) -> None:
    cfg = tiny_config("qwen3")
    base = random_tensors(cfg, seed=9)
    model = model_from_tensors(cfg, base)
    adapters = [load_adapter(write_peft(tmp_path / f"ad{i}", cfg, r=2 + 2 * i, alpha=16,
                                        targets=LORA_MODULES[i:i + 4], seed=10 + i), cfg)
                for i in range(4)]
    slots = AdapterSlots(cfg, max_slots=2)
    seqs = _seqs(cfg, 2, seed=3)
    plan = [(0, 1), (2, 0), (3,), (1, 3), (0, 2), (3, 1)]
    for step in plan:
        mixes: list[Mix] = [[(adapters[j], 1.0)] for j in step]
        want = [run(merged(cfg, base, m), cfg, [s], None)[0]
                for m, s in zip(mixes, seqs, strict=False)]
        _close(run(model, cfg, seqs[:len(step)], mixes, slots), want)
        assert len(slots.resident()) <= 2
    assert slots.evictions >= 4 and slots.rank == 8
    with pytest.raises(LoraCapacityError):  # 3 distinct adapters, 2 slots
        LoraBatch.build([[(adapters[0], 1.0)], [(adapters[1], 1.0)], [(adapters[2], 1.0)]],
                        [1, 1, 1], slots)
    with LoraBatch.build([[(adapters[0], 1.0)], [(adapters[2], 1.0)]], [1, 1], slots):
        pass  # nothing stayed pinned by the failed build
    with LoraBatch.build([[(adapters[0], 1.0)]], [1], slots), pytest.raises(LoraCapacityError):
        LoraBatch.build([[(adapters[1], 1.0)], [(adapters[3], 1.0)]], [1, 1], slots)


@pytest.mark.parametrize("strategy", ["auto", "runs", "dense", "gather"])
def test_apply_matches_kernel_reference(strategy: Strategy) -> None:
    """Every CPU strategy equals the kiln_kernels reference applied once per composition
    position, for decode-like (one row per request) and prefill-like (long runs) batches."""
    from kiln_kernels.lora import lora_ref

    cfg = tiny_config("llama")
    gen = torch.Generator().manual_seed(0)
    adapters = []
    for i, r in enumerate((3, 6, 2)):
        tensors = {}
        for layer in range(cfg.num_layers):
            key = f"model.layers.{layer}.mlp.up_proj"
            tensors[f"{key}.lora_A.weight"] = torch.randn(r, cfg.hidden_size, generator=gen)
            tensors[f"{key}.lora_B.weight"] = torch.randn(cfg.intermediate_size, r, generator=gen)
        adapters.append(adapter_from_state(f"x{i}", {"r": r, "lora_alpha": 2 * r + i}, tensors,
                                           cfg))
    slots = AdapterSlots(cfg, max_slots=4)
    with LoraBatch.build([[(adapters[2], 1.0)]], [1], slots):
        pass  # adapters[2] takes slot 0: the others sit at slots 1, 2 (range starts past 0)
    seen = set()
    for tokens in ([1, 1, 1, 1, 1], [9, 5, 1, 7, 3]):
        mixes: list[Mix] = [[(adapters[0], 0.5)], [], [(adapters[1], 2.0), (adapters[0], -1.0)],
                            [(adapters[1], 1.0)], [(adapters[0], 0.5)]]
        t = sum(tokens)
        x = torch.randn(t, cfg.hidden_size, generator=gen)
        y0 = torch.randn(t, cfg.intermediate_size, generator=gen)
        with LoraBatch.build(mixes, tokens, slots, strategy=strategy) as lb:
            seen.add(lb.strategy)
            got = lb.apply(1, "up_proj", x, y0.clone())
            assert lb.apply(1, "q_proj", x, y0.clone()).equal(y0)  # no adapter targets q_proj
            pair = slots.stacks("up_proj")
            assert pair is not None
            want, mag = y0.clone(), y0.abs()
            for k in range(lb.num_positions):
                lora_ref(x, want, pair[0][1], pair[1][1], lb.slot_idx[k], lb.scales[k])
                lora_ref(x.abs(), mag, pair[0][1].abs(), pair[1][1].abs(), lb.slot_idx[k],
                         abs(lb.scales[k]))
        assert (want - y0).abs().max().item() > 1.0
        # y0 + s * (x @ A) @ B in another order than the reference's per-position loop: sums of
        # hidden, rank and composition terms, each bounded relative to the sum of |terms| (mag)
        bound = reorder_rtol(cfg.hidden_size, 8, 3) * mag
        assert bool(((got - want).abs() <= bound).all())
    assert seen == ({"dense", "runs"} if strategy == "auto" else {strategy})


def test_request_keeps_weights_after_reload(tmp_path: Path) -> None:
    cfg = tiny_config("qwen3")
    base = random_tensors(cfg, seed=4)
    model = model_from_tensors(cfg, base)
    store = AdapterStore(tmp_path)
    write_peft(tmp_path / "tuned", cfg, r=4, alpha=4, targets=("q_proj", "o_proj"), seed=1)
    old = store.load("tuned", cfg)
    assert store.load("tuned", cfg) is old
    write_peft(tmp_path / "tuned", cfg, r=4, alpha=4, targets=("q_proj", "o_proj"), seed=2)
    new = store.load("tuned", cfg)
    assert new.content_sha256 != old.content_sha256
    store.delete("tuned")
    seqs = _seqs(cfg, 2, seed=4)
    mixes: list[Mix] = [[(old, 1.0)], [(new, 1.0)]]
    got = run(model, cfg, seqs, mixes, AdapterSlots(cfg, max_slots=2))
    _close(got, [run(merged(cfg, base, m), cfg, [s], None)[0]
                 for m, s in zip(mixes, seqs, strict=True)])


def test_content_hash_and_prefixes(tmp_path: Path) -> None:
    cfg = tiny_config("llama", tie=True)

    def make(name: str, prefix: bool) -> LoraAdapter:
        folder = write_peft(tmp_path / name, cfg, r=4, alpha=8.0, targets=("k_proj",), seed=3,
                            prefix=prefix)
        return load_adapter(folder, cfg)

    h1, h2, h3 = make("p", True), make("q", True), make("n", False)
    assert h1.content_sha256 == h2.content_sha256 and h1.name == "p" and h2.name == "q"
    assert h3.content_sha256 != h1.content_sha256  # key names are content
    assert h1.weights[(0, "k_proj")][0].equal(h3.weights[(0, "k_proj")][0])
    cfg_file = tmp_path / "q" / "adapter_config.json"
    cfg_file.write_text(cfg_file.read_text().replace('"lora_alpha": 8.0', '"lora_alpha": 9.0'))
    h4 = load_adapter(tmp_path / "q", cfg)
    assert h4.content_sha256 != h1.content_sha256 and h4.scaling == pytest.approx(9 / 4)
    rs = load_adapter(write_peft(tmp_path / "rs", cfg, r=4, alpha=8, targets=("q_proj",),
                                 seed=1, rslora=True), cfg)
    assert rs.scaling == pytest.approx(4.0)


def _corrupt(folder: Path, key_sub: str, tensor: torch.Tensor | None) -> None:
    from safetensors.torch import load_file

    t = load_file(str(folder / "adapter_model.safetensors"))
    hit = next(k for k in t if key_sub in k)
    if tensor is None:
        del t[hit]
    else:
        t[hit] = tensor
    save_file(t, str(folder / "adapter_model.safetensors"))


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda f: _corrupt(f, "layers.0.self_attn.q_proj.lora_A", torch.zeros(4, 63)), "do not fit"),
    (lambda f: _corrupt(f, "layers.1.mlp.down_proj.lora_B", torch.zeros(64, 5)), "do not fit"),
    (lambda f: _corrupt(f, "layers.1.mlp.down_proj.lora_B", None), "no lora_B"),
    (lambda f: _corrupt(f, "layers.0.self_attn.q_proj.lora_A",
                        torch.full((4, 64), float("nan"))), "non-finite"),
    (lambda f: (f / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16}'),
     "do not fit"),
    (lambda f: (f / "adapter_config.json").write_text(
        '{"r": 4, "target_modules": ["q_proj", "embed_tokens"]}'), "unsupported target"),
    (lambda f: (f / "adapter_config.json").write_text('{"r": 0}'), "positive integer"),
    (lambda f: (f / "adapter_config.json").write_text("{nope"), "bad adapter_config"),
    (lambda f: (f / "adapter_model.safetensors").unlink(), "is missing"),
    (lambda f: (f / "adapter_model.safetensors").write_bytes(b"garbage"), "bad adapter_model"),
])
def test_invalid_adapters_rejected(tmp_path: Path, mutate: object, message: str) -> None:
    cfg = tiny_config("qwen3")
    folder = write_peft(tmp_path / "bad", cfg, r=4, alpha=8,
                        targets=("q_proj", "down_proj"), seed=0)
    load_adapter(folder, cfg)  # valid before the mutation
    assert callable(mutate)
    mutate(folder)
    with pytest.raises(AdapterLoadError, match=message):
        load_adapter(folder, cfg)


def test_wrong_base_model_and_layer_rejected(tmp_path: Path) -> None:
    qwen, llama = tiny_config("qwen3"), tiny_config("llama")
    folder = write_peft(tmp_path / "x", qwen, r=2, alpha=2, targets=("k_proj",), seed=0)
    with pytest.raises(AdapterLoadError, match="do not fit"):
        load_adapter(folder, llama)  # head_dim 16 vs 32: k_proj out differs
    deep = write_peft(tmp_path / "deep", qwen, r=2, alpha=2, targets=("o_proj",), seed=0,
                      layers=[5])
    with pytest.raises(AdapterLoadError, match="layer 5"):
        load_adapter(deep, qwen)


def test_non_lora_batch_object_rejected() -> None:
    cfg = tiny_config("llama")
    model = model_from_tensors(cfg, random_tensors(cfg))
    kv = KVCache(cfg, num_blocks=4, block_size=BLOCK, dtype=torch.float32,
                 device=torch.device("cpu"))
    batch = build_forward_batch([([1, 2], 0, [1])], BLOCK)
    batch.lora = "not a lora batch"
    with pytest.raises(TypeError, match="LoraHook"):
        model(batch, kv)


@pytest.mark.slow
def test_default_model_adapter_equals_merged(tmp_path: Path) -> None:
    from tests.tiny_models import default_model

    loaded = default_model()
    cfg, model = loaded.config, loaded.model
    adapter = load_adapter(write_peft(tmp_path / "smol", cfg, r=8, alpha=16,
                                      targets=("q_proj", "v_proj", "up_proj", "down_proj"),
                                      seed=7, layers=[0, 7, 29]), cfg)
    seqs = _seqs(cfg, 2, seed=5)
    got = run(model, cfg, seqs, [[(adapter, 1.0)], []], AdapterSlots(cfg, max_slots=2))
    base_second = run(model, cfg, [seqs[1]], None)[0]
    # The packed GGUF blocks do not see merged weights: run on float32 ones (the loader released
    # the projections' float32 copies; packed_disabled dequantizes them for its duration).
    with packed_disabled(model), torch.no_grad():
        params: dict[str, torch.Tensor] = dict(model.named_parameters())
        for (layer, mod), (a, b) in adapter.weights.items():
            group = "self_attn" if mod in ("q_proj", "v_proj") else "mlp"
            params[f"model.layers.{layer}.{group}.{mod}.weight"] += 2.0 * (b @ a)
        want = run(model, cfg, [seqs[0]], None)[0]
    _close(got, [want, base_second])
