"""Under ``spark-submit`` the pipeline runs on the master spark-submit was given, not on
our embedded ``local[*]`` default."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyspark
from archives import random_items, write_archive

PROBE = """
import json, sys
from pathlib import Path
from sdsync.pipeline.progress import Progress
from sdsync.pipeline.reconcile import ParquetArchive, reconcile
from sdsync.pipeline.session import SessionOptions, build_session

spark, owned = build_session(SessionOptions())
a, b, out = sys.argv[1:]
archives = [ParquetArchive("a", a), ParquetArchive("b", b)]
summary = reconcile(spark, archives, Path(out), Progress(spark))
print(json.dumps({
    "master": spark.sparkContext.master,
    "owned": owned,
    "missing": summary["missing_per_archive"],
    "method": summary["method"],
}))
spark.stop()
"""


def test_spark_submit_master_is_used(tmp_path: Path) -> None:
    items = random_items(500, random.Random(31))
    a = write_archive(tmp_path / "a", items)
    b = write_archive(tmp_path / "b", items[7:])
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    home = Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable}
    submit = [str(home / "bin" / "spark-submit"), "--master", "local[1]"]
    loopback = ("spark.driver.bindAddress=127.0.0.1", "spark.driver.host=127.0.0.1")
    for conf in ("spark.ui.enabled=false", *loopback):
        submit += ["--conf", conf]
    done = subprocess.run(
        [*submit, str(probe), str(a), str(b), str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["master"] == "local[1]"
    assert result["owned"] is True
    assert result["missing"] == {"a": 0, "b": 7}
    assert result["method"] == "one pass"  # Python workers found this venv's sdsync
