"""Shared fixtures: the tiny seeded model built in code (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrtpo.testing import save_tiny, tiny_model_and_tokenizer

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer): a 2-layer Llama with a 512-token byte-level BPE, seeded."""
    return tiny_model_and_tokenizer(seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The tiny model saved as a Hugging Face folder."""
    return save_tiny(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def shared_benchmarks() -> Path:
    """`../shared/benchmarks`, or skip when it is absent (a user's machine has no copy)."""
    path = SHARED / "benchmarks"
    if not path.is_dir():
        pytest.skip(f"{path} is absent")
    return path
