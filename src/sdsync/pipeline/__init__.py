"""The data pipeline on Spark: consolidating simulated logs, reconciling store archives.

Everything here needs the ``spark`` extra (``pip install 'sdsync[spark]'``).  Plain
Parquet in and out; each command writes ``summary.json`` beside its outputs.
"""
