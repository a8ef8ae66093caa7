"""Benchmarks: `make bench` (bench/run.py) runs jobbus and its peers side by side; see docs/benchmarks.md."""
