"""Builders of the bundled datasets in `src/mrtpo/data/` (not part of the installed package)."""
