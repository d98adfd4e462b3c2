"""Stage-by-stage progress: a live status line for people, job descriptions for Spark.

Each pipeline step runs inside ``with progress.stage("name"):``.  The name becomes the
Spark job description (what the Spark UI and the history server list for every job the
step starts) and the text of a live status line; when the step ends a line with its
duration is printed, so a long run shows where it is and a finished one where the time
went.  Without a console (library use, tests) only the job descriptions are set.

A step that runs many tasks whose count we know (one simulation per task in a sweep)
shows a bar instead, fed by Spark's status tracker: the completed tasks of the active
stages, polled twice a second from a helper thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar

from sdsync.pipeline.session import is_connect


class Progress:
    """Names the current stage for Spark and, if given a console, for the user."""

    def __init__(self, spark: SparkSession, console: Console | None = None) -> None:
        self._spark = spark
        self._console = console
        self.timings: dict[str, float] = {}

    def _describe(self, text: str | None) -> None:
        if is_connect(self._spark):
            return  # Connect has no SparkContext; the server names jobs itself.
        self._spark.sparkContext.setJobDescription(text)  # type: ignore[arg-type]

    @contextmanager
    def stage(self, name: str, *, tasks: int | None = None) -> Iterator[None]:
        """Run one named step; record and show its duration (and its tasks, if counted)."""
        start = time.perf_counter()
        self._describe(f"sdsync: {name}")
        try:
            if self._console is None:
                yield
            elif tasks is not None and not is_connect(self._spark):
                with self._task_bar(name, tasks):
                    yield
            else:
                with self._console.status(f"{escape(name)}…"):
                    yield
        finally:
            self._describe(None)
        elapsed = time.perf_counter() - start
        self.timings[name] = round(self.timings.get(name, 0.0) + elapsed, 3)
        if self._console is not None:
            self._console.print(f"[green]✓[/] {escape(name)} [dim]({elapsed:.1f} s)[/]")

    @contextmanager
    def _task_bar(self, name: str, total: int) -> Iterator[None]:
        tracker = self._spark.sparkContext.statusTracker()
        stop = threading.Event()
        bar = Bar(
            TextColumn(escape(name)),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self._console,
            transient=True,
        )
        task = bar.add_task(name, total=total)

        def poll() -> None:
            done = 0
            while not stop.wait(0.5):
                stages = (tracker.getStageInfo(s) for s in tracker.getActiveStageIds())
                done = max(done, sum(s.numCompletedTasks for s in stages if s is not None))
                bar.update(task, completed=min(done, total))

        poller = threading.Thread(target=poll, name="sdsync-progress", daemon=True)
        with bar:
            poller.start()
            try:
                yield
            finally:
                stop.set()
                poller.join()
