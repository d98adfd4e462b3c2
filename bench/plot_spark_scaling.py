"""Plot how reconcile, the Spark join and DuckDB grow with the archives' rows.

Reads the ``--json`` records of ``bench/spark_reconcile.py`` runs (one per size) and
draws best-of-rounds wall time against rows per archive, one line per method:

    .venv/bin/python bench/spark_reconcile.py --rows 10000000 --json out/s10.json
    .venv/bin/python bench/spark_reconcile.py --rows 30000000 --rounds 2 --json out/s30.json
    .venv/bin/python bench/plot_spark_scaling.py out/s10.json out/s30.json \\
        --out docs/pipeline/reconcile-scaling.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

LABELS = {
    "join": "Spark full outer join",
    "two passes": "reconcile, two passes",
    "duckdb": "DuckDB full outer join",
    "reconcile": "reconcile (cold)",
    "cached": "reconcile (fingerprint cache warm)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = sorted((json.loads(path.read_text()) for path in args.records), key=lambda r: r["rows"])
    if len({run["archives"] for run in runs}) != 1:
        raise SystemExit("records of different archive counts: plot one count at a time")
    figure, axes = plt.subplots(figsize=(7, 4.2))
    rows = [run["rows"] / 1e6 for run in runs]
    for method, label in LABELS.items():
        axes.plot(rows, [run["seconds"][method] for run in runs], marker="o", label=label)
    axes.set_xlabel("rows per archive (millions)")
    axes.set_ylabel("wall time, best of rounds (s)")
    axes.set_title(f"{runs[0]['archives']} archives, 2 cores, one machine")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
