"""Test tooling, as ``trio.testing`` is trio's: what tests, benchmarks and ``make fuzz``
use and the library itself never imports (tests/test_layers.py checks).

* :mod:`~sdsync.testing.gowaku` — a go-waku node on loopback, to interoperate with;
* :mod:`~sdsync.testing.nwaku` — an nwaku node (the reference Waku node) on loopback, likewise;
* :mod:`~sdsync.testing.hostile` — a node's memory and an honest peer's service, measured
  while a hostile-peer test attacks it;
* :mod:`~sdsync.testing.proxy` — a reverse proxy on loopback that names each client in
  ``X-Forwarded-For``, one port per client address, as a TLS proxy in front of a node does;
* :mod:`~sdsync.testing.pgcluster` — throwaway PostgreSQL clusters for the archive's tests;
* :mod:`~sdsync.testing.memory` — :class:`~sdsync.testing.memory.MemoryNetwork`, an
  in-process network with seeded loss, bursts, latency, duplication and partitions, its
  transports, and :mod:`~sdsync.testing.memory_waku`'s Waku nodes in memory;
* :mod:`~sdsync.testing.memory_store` — a store node in memory for ReliableChannel tests;
* :mod:`~sdsync.testing.oracle` — a reference SDS decoder the fuzzer checks ours against;
* :mod:`~sdsync.testing.reconcile_fuzz`, :mod:`~sdsync.testing.sync_fuzz` — recorded
  reconciliation frames and Store Sync batches, mutated, with the checks each must pass.
"""
