"""Extract NLTK's English punkt_tab model from the `llama-index-core` wheel on PyPI.

IFEval's reference checkers split sentences with punkt_tab; NLTK's downloader would fetch it
from the internet at run time, which mrtpo never does. The wheel carries the same files under
`llama_index/core/_static/nltk_cache/tokenizers/punkt_tab/english/`; we unpack only those
(the package itself is neither installed nor imported).

Usage: python scripts/fetch_punkt_tab.py DEST_DIR
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llama-index-core==0.14.25"
PREFIX = "llama_index/core/_static/nltk_cache/tokenizers/punkt_tab/english/"


def main(dest: str) -> None:
    target = Path(dest) / "tokenizers" / "punkt_tab" / "english"
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", tmp, WHEEL],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            members = [
                m for m in archive.namelist() if m.startswith(PREFIX) and not m.endswith("/")
            ]
            if not members:
                raise SystemExit(f"{wheel.name} has no files under {PREFIX}")
            target.mkdir(parents=True, exist_ok=True)
            for member in members:
                (target / member[len(PREFIX) :]).write_bytes(archive.read(member))
    print(f"punkt_tab English: {len(members)} files in {target}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
