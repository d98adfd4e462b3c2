"""Tooling for tests and benchmarks (never imported by the library itself):
:mod:`~sdsync.testing.gowaku` runs a go-waku node to test against;
:mod:`~sdsync.testing.hostile` measures a node's memory and an honest peer's service
while a hostile-peer test attacks it."""
