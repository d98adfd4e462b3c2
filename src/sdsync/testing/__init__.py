"""Tooling for tests and benchmarks that drive other implementations (never imported by
the library itself)."""
