"""Benchmarks of DESIGN §9 (never run by `make test`); see bench/README.md."""
