"""Bundled instruction-following prompts and the script that builds them (`build.py`)."""
