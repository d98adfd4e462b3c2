"""The data pipeline on Spark: consolidating logs, reconciling store archives, reporting
on a simulation, sweeping the simulator over a parameter grid.

Everything here needs the ``spark`` extra (``pip install 'sdsync[spark]'``).  Plain
Parquet in and out; each command writes ``summary.json`` beside its outputs.  See
docs/pipeline.md.
"""
