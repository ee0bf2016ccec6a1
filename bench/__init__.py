"""inferbus benchmark suite: python -m bench.suite (see bench/suite.py)."""
