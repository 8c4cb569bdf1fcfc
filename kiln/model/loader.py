"""``load_model``: one entry point for HF folders, GGUF files and the embedded default.

With ``torch_free`` (``kiln serve``), a GGUF on the CPU whose every matrix has a C kernel loads
as a :class:`~kiln.model.native.c_model.CModel` without importing torch (``kiln.engine.runner`` runs
it, with its torch twin beside it for the steps that need one); otherwise, and for every other
model, as a torch ``CausalLM``. This module imports torch only for the latter."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal, Union, overload

from kiln.model.checkpoint.config import ModelConfig
from kiln.model.checkpoint.locate import (
    DEFAULT_MODEL_NAME,
    ModelNotFoundError,
    default_model_path,
    is_gguf,
)
from kiln.model.native.early_tiles import take_tiled, tiles_will_be_held
from kiln.resident import release_freed_heap
from kiln.text.chat_template import ChatTemplate
from kiln.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    import torch

    from kiln.model.base import CausalLM
    from kiln.model.native.c_model import CModel

# The dtype a C model is served in, as provenance records name it (``str(torch.float32)``): a
# model's identity is the same whichever engine serves it.
C_MODEL_DTYPE = "torch.float32"


@dataclass
class LoadedModel:
    """A model loaded as a torch ``CausalLM``."""

    model: CausalLM
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    served_name: str
    source: str
    dtype: torch.dtype
    device: torch.device
    generation_config: dict[str, object] = field(default_factory=dict)

    @property
    def dtype_name(self) -> str:
        """The served dtype as provenance records name it (``torch.float32``)."""
        return str(self.dtype)

    @property
    def device_type(self) -> str:
        return self.device.type


@dataclass
class LoadedCModel:
    """A GGUF loaded for the CPU step alone, without torch (``load_model(torch_free=True)``):
    float32 on the CPU."""

    model: CModel
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    served_name: str
    source: str
    generation_config: dict[str, object] = field(default_factory=dict)
    dtype_name: ClassVar[str] = C_MODEL_DTYPE
    device_type: ClassVar[str] = "cpu"


Loaded = Union[LoadedModel, LoadedCModel]  # noqa: UP007 (CModel, CausalLM: type checkers' names)


@overload
def load_model(path: str | None = None, *, dtype: str | None = None, device: str | None = None,
               chat_template_path: str | None = None, served_model_name: str | None = None,
               quant_kernels: bool = True,
               torch_free: Literal[False] = False) -> LoadedModel: ...


@overload
def load_model(path: str | None = None, *, dtype: str | None = None, device: str | None = None,
               chat_template_path: str | None = None, served_model_name: str | None = None,
               quant_kernels: bool = True, torch_free: bool) -> Loaded: ...


def load_model(path: str | None = None, *, dtype: str | None = None, device: str | None = None,
               chat_template_path: str | None = None, served_model_name: str | None = None,
               quant_kernels: bool = True, torch_free: bool = False) -> Loaded:
    """Load a model to serve.

    ``path``: an HF folder (config.json + safetensors + tokenizer.json), a ``.gguf`` file, or
    None for the embedded default (SmolLM2-135M-Instruct). ``dtype`` defaults to bfloat16 on
    CUDA and float32 on CPU. ``chat_template_path`` overrides the model's chat template.
    ``torch_free``: load a GGUF as a ``CModel`` where it can be (see the module docstring).
    ``quant_kernels``: the ``KILN_QUANT_KERNELS`` setting (``kiln.config.ProcessSettings``, which
    the server reads and passes in: the model reads no setting of the layers above it).
    """
    if path is None:
        file = default_model_path()
        default_name = DEFAULT_MODEL_NAME
    else:
        file = Path(path).expanduser()
        if not file.exists():
            raise ModelNotFoundError(f"model path {path!r} does not exist")
        default_name = file.stem if file.is_file() else file.resolve().name
    tiled = None  # the early tiles (kiln.model.native.early_tiles), once taken here
    c_model = None
    # a float32 model on the CPU (auto: a machine without a GPU), as early tiling guesses it
    if torch_free and is_gguf(file) and tiles_will_be_held(device, dtype, quant_kernels):
        from kiln.model.native.c_model import CModel

        tiled = take_tiled(file)
        c_model = CModel.load(file, tiled)
    if c_model is not None:
        from kiln.model.checkpoint.gguf_tokenizer import tokenizer_from_gguf

        meta = c_model.take_metadata()
        tokenizer = tokenizer_from_gguf(meta)
        template = meta.get("tokenizer.chat_template")
        chat = _chat_template(template if isinstance(template, str) else None, tokenizer, {},
                              file, chat_template_path)
        del meta, tiled  # the file's map (kiln.model.checkpoint.gguf_index) with them
        release_freed_heap()
        return LoadedCModel(model=c_model, config=c_model.config, tokenizer=tokenizer,
                            chat_template=chat, served_name=served_model_name or default_name,
                            source=str(file.resolve()))
    from kiln.model.devices import resolve_device, resolve_dtype
    from kiln.model.gguf_loader import load_gguf
    from kiln.model.hf_loader import load_hf_folder

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
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
        gg = load_gguf(file, torch_dtype, dev, quant_kernels=quant_kernels, tiled=tiled)
        model, cfg, tokenizer, template = gg.model, gg.config, gg.tokenizer, gg.chat_template
        del gg
        release_freed_heap()
        specials = {}
    else:
        raise ModelNotFoundError(
            f"{path!r} is neither a model folder (config.json + safetensors) nor a GGUF file")
    chat = _chat_template(template, tokenizer, specials, file, chat_template_path)
    return LoadedModel(model=model, config=cfg, tokenizer=tokenizer, chat_template=chat,
                       served_name=served_model_name or default_name, source=str(file.resolve()),
                       dtype=torch_dtype, device=dev, generation_config=generation_config)


def _chat_template(template: str | None, tokenizer: Tokenizer, specials: dict[str, str],
                   file: Path, chat_template_path: str | None) -> ChatTemplate:
    """The model's chat template, or the one at ``chat_template_path`` instead."""
    if chat_template_path is not None:
        p = Path(chat_template_path).expanduser()
        if not p.is_file():
            raise ModelNotFoundError(f"chat template file {chat_template_path!r} does not exist")
        template = p.read_text(encoding="utf-8")
    if template is None:
        raise ModelNotFoundError(
            f"the model at {file} has no chat template; pass one with --chat-template FILE")
    return ChatTemplate(template, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
                        special_tokens=specials)


def torch_model(model: CModel) -> CausalLM:
    """The torch model of a C model's file over the same tile arrays (``load_gguf`` on the CPU
    in float32 with the packed kernels, which shares them): imports torch. Its torch
    twin beside the C step, for the steps that need it (``kiln.engine.runner``)."""
    import torch

    from kiln.model.gguf_loader import load_gguf
    from kiln.model.native.early_tiles import Tiled

    tiled = Tiled(model.path, None, dict(model.tiles))  # load_gguf pops what it takes
    return load_gguf(model.path, torch.float32, torch.device("cpu"), quant_kernels=True,
                     tiled=tiled).model

