"""``load_model``: one entry point for HF folders, GGUF files and the embedded default."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from kiln.config import process_settings
from kiln.model.base import CausalLM
from kiln.model.config import ModelConfig
from kiln.model.gguf_loader import load_gguf, release_freed_heap
from kiln.model.hf_loader import load_hf_folder
from kiln.model.locate import (
    DEFAULT_MODEL_NAME,
    ModelNotFoundError,
    default_model_path,
    is_gguf,
)
from kiln.model.plan import resolve_device, resolve_dtype
from kiln.text.chat_template import ChatTemplate
from kiln.text.tokenizer import Tokenizer


@dataclass
class LoadedModel:
    model: CausalLM
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    served_name: str
    source: str
    dtype: torch.dtype
    device: torch.device
    generation_config: dict[str, object] = field(default_factory=dict)


def load_model(path: str | None = None, *, dtype: str | None = None, device: str | None = None,
               chat_template_path: str | None = None, served_model_name: str | None = None,
               quant_kernels: bool | None = None) -> LoadedModel:
    """Load a model to serve.

    ``path``: an HF folder (config.json + safetensors + tokenizer.json), a ``.gguf`` file, or
    None for the embedded default (SmolLM2-135M-Instruct). ``dtype`` defaults to bfloat16 on
    CUDA and float32 on CPU. ``chat_template_path`` overrides the model's chat template.
    """
    if quant_kernels is None:  # the quant_kernels setting (kiln.config)
        quant_kernels = process_settings().quant_kernels
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    if path is None:
        file = default_model_path()
        default_name = DEFAULT_MODEL_NAME
    else:
        file = Path(path).expanduser()
        if not file.exists():
            raise ModelNotFoundError(f"model path {path!r} does not exist")
        default_name = file.stem if file.is_file() else file.resolve().name
    generation_config: dict[str, object] = {}
    if file.is_dir():
        hf = load_hf_folder(file, torch_dtype, dev, quant_kernels=quant_kernels)
        model, cfg, tokenizer, template = hf.model, hf.config, hf.tokenizer, hf.chat_template
        generation_config = dict(hf.generation_config)
        specials = {k: v for k in ("unk_token", "pad_token")
                    if isinstance(v := hf.tokenizer_config.get(k), str)}
        del hf
        # the bf16 default model's folder: 656 MiB RSS after the load, 510 after (the tensors
        # read from the file, freed once packed, stay in glibc's heap)
        release_freed_heap()
    elif is_gguf(file):
        gg = load_gguf(file, torch_dtype, dev, quant_kernels=quant_kernels)
        model, cfg, tokenizer, template = gg.model, gg.config, gg.tokenizer, gg.chat_template
        del gg
        release_freed_heap()
        specials = {}
    else:
        raise ModelNotFoundError(
            f"{path!r} is neither a model folder (config.json + safetensors) nor a GGUF file")
    if chat_template_path is not None:
        p = Path(chat_template_path).expanduser()
        if not p.is_file():
            raise ModelNotFoundError(f"chat template file {chat_template_path!r} does not exist")
        template = p.read_text(encoding="utf-8")
    if template is None:
        raise ModelNotFoundError(
            f"the model at {file} has no chat template; pass one with --chat-template FILE")
    chat = ChatTemplate(template, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
                        special_tokens=specials)
    return LoadedModel(model=model, config=cfg, tokenizer=tokenizer, chat_template=chat,
                       served_name=served_model_name or default_name, source=str(file.resolve()),
                       dtype=torch_dtype, device=dev, generation_config=generation_config)
