"""The data pipeline on Spark: consolidating logs, reconciling store archives, reporting
on a simulation, sweeping the simulator over a parameter grid.

Everything here needs the ``spark`` extra (``pip install 'sdsync[spark]'``).  Plain
Parquet in and out; each command writes ``summary.json`` beside its outputs.  See
docs/pipeline.md.
"""

ONE_PASS_ROWS = 6_000_000
"""How many rows a reconcile task may hold at once to take the one-pass route (the CLI
reads the default here without importing Spark)."""
