"""The real runner and sampler on a tiny random llama: layout changes never change tokens."""

from __future__ import annotations

import pytest

from kiln.engine.config import EngineConfig
from kiln.engine.loop import build_core, build_output_processor
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request, SamplingParams
from kiln.engine.torch_step import kv_num_blocks
from kiln.model import LoadedModel
from tests.engine.drive import drive, text, token_ids

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, max_tokens=12, seed=1234,
                         ignore_eos=True)
PENALIZED = SamplingParams(temperature=0.8, repetition_penalty=1.3, presence_penalty=0.5,
                           frequency_penalty=0.2, max_tokens=12, seed=99, ignore_eos=True)


def prompt(m: LoadedModel, s: str) -> list[int]:
    return m.tokenizer.encode(s)


def gen(m: LoadedModel, reqs: list[Request], **cfg: int | bool
        ) -> dict[str, list[RequestOutput]]:
    config = EngineConfig(**{"block_size": 4, "num_blocks": 256, **cfg})  # type: ignore[arg-type]
    sched, runner = build_core(m, config)
    return drive(sched, runner, reqs, output=build_output_processor(m))


def req(m: LoadedModel, rid: str, s: str, sp: SamplingParams = GREEDY) -> Request:
    return Request(rid, prompt(m, s), sp)


TEXT = "The quick brown fox jumps over the lazy dog. Hello, world! How are you today?"


@pytest.mark.parametrize("sp", [GREEDY, SAMPLED, PENALIZED], ids=["greedy", "seeded", "pen"])
def test_chunking_and_prefix_cache_do_not_change_tokens(tiny_llama: LoadedModel,
                                                        sp: SamplingParams) -> None:
    base = token_ids(gen(tiny_llama, [req(tiny_llama, "a", TEXT, sp)])["a"])
    assert len(base) == 12
    chunked = gen(tiny_llama, [req(tiny_llama, "a", TEXT, sp)], max_num_batched_tokens=5)
    assert token_ids(chunked["a"]) == base
    # Second identical request hits the prefix cache and must produce the same tokens.
    config = EngineConfig(block_size=4, num_blocks=256)
    sched, runner = build_core(tiny_llama, config)
    drive(sched, runner, [req(tiny_llama, "a", TEXT, sp)])
    again = drive(sched, runner, [req(tiny_llama, "b", TEXT, sp)])["b"]
    assert again[-1].num_cached_tokens > 0 and token_ids(again) == base


def test_seeded_request_same_alone_and_in_batch(tiny_llama: LoadedModel) -> None:
    alone = token_ids(gen(tiny_llama, [req(tiny_llama, "t", TEXT, SAMPLED)])["t"])
    others = [req(tiny_llama, f"o{i}", f"Numbers {i} and {i * 7}", SAMPLED if i % 2 else
                  PENALIZED) for i in range(4)]
    batch = gen(tiny_llama, [*others, req(tiny_llama, "t", TEXT, SAMPLED)])
    assert token_ids(batch["t"]) == alone
    unseeded = gen(tiny_llama, [req(tiny_llama, "u", TEXT, SamplingParams(max_tokens=3))])["u"]
    assert 0 <= unseeded[-1].seed < 2**63  # drawn and reported


def test_preemption_recompute_same_tokens(tiny_llama: LoadedModel) -> None:
    reqs = [req(tiny_llama, f"r{i}", f"{TEXT[: 20 + 9 * i]}", sp)
            for i, sp in enumerate([GREEDY, SAMPLED, PENALIZED, SAMPLED])]
    roomy = gen(tiny_llama, reqs)
    need = [-(-(len(r.prompt_token_ids) + 12) // 4) for r in reqs]
    tight_cfg = EngineConfig(block_size=4, num_blocks=max(max(need), sum(need) // 2))
    sched, runner = build_core(tiny_llama, tight_cfg)
    tight = drive(sched, runner, reqs)
    assert sched.num_preemptions > 0
    assert {k: token_ids(v) for k, v in tight.items()} == {k: token_ids(v) for k, v in
                                                           roomy.items()}
    assert sched.pool.num_used_blocks == 0


def test_logprobs_and_text_are_consistent(tiny_llama: LoadedModel) -> None:
    outs = gen(tiny_llama, [req(tiny_llama, "a", TEXT, SAMPLED)])["a"]
    lps = [lp for o in outs for lp in o.new_logprobs]
    assert len(lps) == 12 and all(lp <= 0.0 for lp in lps)
    assert text(outs) == tiny_llama.tokenizer.decode(token_ids(outs), skip_special_tokens=True)


def test_stop_string_with_real_detokenizer(tiny_llama: LoadedModel) -> None:
    full = text(gen(tiny_llama, [req(tiny_llama, "a", TEXT)])["a"])
    assert len(full) >= 6
    stop = full[3:6]
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=(stop,))
    outs = gen(tiny_llama, [req(tiny_llama, "a", TEXT, sp)])["a"]
    assert text(outs) == full[: full.index(stop)]
    assert outs[-1].finish_reason == "stop" and outs[-1].stop_reason == stop


def test_kv_blocks_from_memory_budget(tiny_llama: LoadedModel) -> None:
    from kiln.model.kv_cache import KVCache

    per = KVCache.bytes_per_block(tiny_llama.config, 16, tiny_llama.dtype)
    n = kv_num_blocks(tiny_llama.config, EngineConfig(kv_memory_mb=1), tiny_llama.dtype)
    assert n == 1024 * 1024 // per
    assert kv_num_blocks(tiny_llama.config, EngineConfig(num_blocks=7), tiny_llama.dtype) == 7


def test_the_default_kv_cache_holds_one_context(tiny_llama: LoadedModel) -> None:
    """With no kv_memory_mb the cache is DEFAULT_KV_MEMORY_MB, or one sequence of the context
    length where that is more (a Qwen2.5-0.5B GGUF had failed to start on the default)."""
    import dataclasses

    from kiln.engine.config import DEFAULT_KV_MEMORY_MB
    from kiln.model.kv_cache import KVCache

    per = KVCache.bytes_per_block(tiny_llama.config, 16, tiny_llama.dtype)
    default = DEFAULT_KV_MEMORY_MB * 1024 * 1024 // per
    assert kv_num_blocks(tiny_llama.config, EngineConfig(), tiny_llama.dtype) == default
    # a context longer than the default holds: one sequence of it, rounded up to whole blocks
    long_context = (default + 2) * 16 - 5
    cfg = dataclasses.replace(tiny_llama.config, max_position=long_context)
    assert kv_num_blocks(cfg, EngineConfig(), tiny_llama.dtype) == default + 2
    # ... capped by max_model_len, as the engine's context is
    assert kv_num_blocks(cfg, EngineConfig(max_model_len=64), tiny_llama.dtype) == default
    # an explicit size is kept (check_kv_capacity refuses it at start if too small)
    assert kv_num_blocks(cfg, EngineConfig(kv_memory_mb=1), tiny_llama.dtype) == 1024 * 1024 // per


def test_half_kv_cache_doubles_the_blocks_and_serves(tiny_llama: LoadedModel) -> None:
    """--kv-cache-dtype float16: twice the blocks in the same memory, K/V stored as half, and
    the engine still generates (the model's own float32 cache is the exact default)."""
    import torch

    from kiln.model.devices import torch_dtype
    from kiln.model.native.plan import model_plan, with_kv_cache

    exact = EngineConfig(kv_memory_mb=1)
    half = EngineConfig(kv_memory_mb=1, kv_cache_dtype="float16")
    assert tiny_llama.dtype == torch.float32
    half_plan = with_kv_cache(tiny_llama.model.plan, "float16")
    assert kv_num_blocks(tiny_llama.config, half, torch_dtype(half_plan.kv_dtype)) == \
        2 * kv_num_blocks(tiny_llama.config, exact, tiny_llama.dtype)
    cuda_plan = model_plan(torch.device("cuda"), torch.float32, packed=False, c_step=False)
    with pytest.raises(ValueError, match="CPU only"):
        with_kv_cache(cuda_plan, "float16")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="bfloat16")
    sched, runner = build_core(tiny_llama, EngineConfig(block_size=4, num_blocks=256,
                                                        kv_cache_dtype="float16"))
    assert runner.torch_kv.dtype == torch.float16
    outs = drive(sched, runner, [req(tiny_llama, "a", TEXT)])["a"]
    assert len(token_ids(outs)) == 12


def test_half_kv_cache_changes_the_inference_config_hash(tiny_llama: LoadedModel) -> None:
    """Provenance: a float16 KV cache changes the numbers, so it changes the policy's inference
    config hash; the exact default keeps the hash it always had."""
    from kiln.config import ServerConfig
    from kiln.serving import EngineBackend

    ids = []
    for dtype in ("auto", "float16", "auto"):
        backend = EngineBackend(tiny_llama, ServerConfig(kv_cache_dtype=dtype, kv_memory_mb=8))
        identity = backend.policy_identity()
        assert identity is not None
        ids.append(identity.inference_config_sha256)
        backend.shutdown()
    assert ids[0] == ids[2] != ids[1]


def test_start_hashes_the_policy_identity_off_the_event_loop(tiny_llama: LoadedModel) -> None:
    """``start`` computes the content-addressed identity on a thread of its own (hashing a large
    model's files takes seconds, which on first use would stall the event loop); a caller gets
    the same object once it is ready."""
    import threading
    import time

    from kiln.config import ServerConfig
    from kiln.serving import EngineBackend

    backend = EngineBackend(tiny_llama, ServerConfig(kv_memory_mb=8))
    computed: list[str] = []
    real = backend._compute_policy

    def spy():
        computed.append(threading.current_thread().name)
        return real()

    backend._compute_policy = spy  # type: ignore[method-assign]
    backend.start()
    try:
        deadline = time.monotonic() + 30
        while not backend._policy_done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert computed == ["kiln-identity"]
        first = backend.policy_identity()
        assert first is not None and backend.policy_identity() is first and len(computed) == 1
    finally:
        backend.shutdown()


def test_the_kv_layout_follows_the_path_that_reads_it(tiny_llama: LoadedModel,
                                                      smollm: LoadedModel) -> None:
    """Head-major KV blocks where the C step runs the model (the default GGUF), contiguous ones
    where the torch path does (a float32 HF folder: its gathers take whole slots)."""
    config = EngineConfig(block_size=4, num_blocks=8)
    _, torch_runner = build_core(tiny_llama, config)
    assert tiny_llama.model.plan.step == "torch" and not torch_runner.torch_kv.heads_major
    assert torch_runner.torch_kv.k[0].is_contiguous()
    if smollm.model.plan.step != "c":
        pytest.skip("no C compiler: the default model runs on the torch path")
    _, c_runner = build_core(smollm, config)
    assert c_runner.torch_kv.heads_major and c_runner.torch_kv.k[0].permute(0, 2, 1, 3).is_contiguous()


def test_non_finite_logits_end_that_request_in_an_error(tiny_llama: LoadedModel,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A row whose logits overflowed gets finish_reason "error" with the reason, never a
    made-up token; the other rows of the step sample as usual."""
    sched, runner = build_core(tiny_llama, EngineConfig(block_size=4, num_blocks=256))
    model = runner.torch_step().model
    forward = model.forward
    long_prompt = len(prompt(tiny_llama, TEXT))
    short = "Hi"
    assert len(prompt(tiny_llama, short)) + GREEDY.max_tokens < long_prompt

    def poisoning(batch, kv):
        logits = forward(batch, kv).clone()
        at = batch.positions[batch.logits_indices]
        for row in range(logits.shape[0]):  # only the long prompt's rows go bad
            if int(at[row]) >= long_prompt - 1:
                logits[row, 3] = float("inf") if row % 2 else float("nan")
        return logits

    base = token_ids(gen(tiny_llama, [req(tiny_llama, "b", short)])["b"])
    monkeypatch.setattr(model, "forward", poisoning)  # the shared model: put back after
    outs = drive(sched, runner, [req(tiny_llama, "x", TEXT), req(tiny_llama, "b", short),
                                 req(tiny_llama, "y", TEXT)])
    for rid in ("x", "y"):
        assert outs[rid][-1].finish_reason == "error"
        assert "non-finite logits" in (outs[rid][-1].error or "")
        assert token_ids(outs[rid]) == []
    assert token_ids(outs["b"]) == base and len(base) == GREEDY.max_tokens
    assert sched.pool.num_used_blocks == 0  # the failed requests gave their blocks back


@pytest.mark.parametrize("filters", [{"top_p": 1e-300}, {"min_p": 1.5}, {"top_p": 1e-10}])
def test_filters_that_keep_only_the_top_token_decode_greedily(tiny_llama: LoadedModel,
                                                              filters: dict[str, float]) -> None:
    """top_p 1e-300 rounds to 0.0 ("off") in float32 unless the engine holds it above 0; min_p
    above 1 would otherwise keep nothing."""
    sp = SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True,
                        **filters)  # type: ignore[arg-type]
    greedy = token_ids(gen(tiny_llama, [req(tiny_llama, "g", TEXT)])["g"])
    assert token_ids(gen(tiny_llama, [req(tiny_llama, "s", TEXT, sp)])["s"]) == greedy


def test_logits_processors_that_ban_every_token_end_that_request(tiny_llama: LoadedModel
                                                                 ) -> None:
    """allowed_token_ids whose only token is a bad word leave nothing to sample: that request
    ends in an error saying so (never a made-up token); the other sample as usual."""
    base = token_ids(gen(tiny_llama, [req(tiny_llama, "b", "Hi")])["b"])
    stuck = SamplingParams(temperature=0.0, max_tokens=4, allowed_token_ids=(5,),
                           bad_words_ids=((5,),))
    outs = gen(tiny_llama, [req(tiny_llama, "x", TEXT, stuck), req(tiny_llama, "b", "Hi")])
    assert outs["x"][-1].finish_reason == "error" and token_ids(outs["x"]) == []
    assert "allow no token" in (outs["x"][-1].error or "")
    assert token_ids(outs["b"]) == base
