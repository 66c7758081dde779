"""Shared fixtures: the tiny seeded model built in code (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

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


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module of tiny-tensor tests, restored afterwards: on a shared
    2-core machine several threads per process mostly wait on one another (seen 5-50x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
