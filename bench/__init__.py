"""Benchmarks (``python -m bench.<name>``); results are committed under ``bench/results``."""
