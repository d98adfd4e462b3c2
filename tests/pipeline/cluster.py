"""A real standalone Spark cluster on 127.0.0.1 for the tests: one master and two workers,
started from pyspark's own ``bin/spark-class`` as a user without a Spark install would.

Each worker has one core, its own memory and its own work directory, and runs in a process
group of its own: the executors it launches are its children, so killing the group is
what losing that machine looks like (:meth:`SparkCluster.kill_worker`). Every process's
output goes to a log file in the cluster's directory; :meth:`SparkCluster.logs` gathers
them for failure messages.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
LOOPBACK = "127.0.0.1"
#: Liveness bound for the master and the workers to come up, not a timing assertion.
START_S = 120


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def spark_env() -> dict[str, str]:
    """What every process of the cluster, and a driver talking to it, runs with: Spark
    binds to loopback only and never daemonizes (we own the processes)."""
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_NO_DAEMONIZE": "1",
    }


def driver_env() -> dict[str, str]:
    """:func:`spark_env` for a driver: its jobs start once both executors are there, so
    that every job runs on both workers (Spark's default in standalone mode is to start
    with whichever registered first)."""
    conf = "--conf spark.scheduler.minRegisteredResourcesRatio=1.0"
    return {**spark_env(), "PYSPARK_SUBMIT_ARGS": f"{conf} pyspark-shell"}


@dataclass
class SparkCluster:
    root: Path
    workers: int = 2
    worker_memory: str = "1g"
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", LOOPBACK, "--port", str(self.port), "--webui-port", str(self.ui_port)),
        )
        self._wait(lambda state: state.get("status") == "ALIVE", "the master to start")
        for i in range(self.workers):
            work = self.root / f"worker-{i}"
            work.mkdir(exist_ok=True)
            self._spawn(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                *("--host", LOOPBACK, "--cores", "1", "--memory", self.worker_memory),
                *("--webui-port", str(free_port()), "--work-dir", str(work), self.url),
            )
        self._wait(
            lambda state: state.get("aliveworkers") == self.workers,
            f"{self.workers} workers to register",
        )

    def _spawn(self, name: str, main_class: str, *args: str) -> None:
        with (self.root / f"{name}.log").open("ab") as log:
            self._processes.append(
                subprocess.Popen(
                    [str(SPARK_HOME / "bin" / "spark-class"), main_class, *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=spark_env(),
                    start_new_session=True,
                )
            )

    def state(self) -> dict[str, Any]:
        """The master's own view (its web UI's JSON): workers, apps, cores."""
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.ui_port}/json/", timeout=5) as r:
            state: dict[str, Any] = json.load(r)
            return state

    def _wait(self, ready: Callable[[dict[str, Any]], bool], what: str) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            for process in self._processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a cluster process exited while waiting for {what}")
            try:
                if ready(self.state()):
                    return
            except OSError:
                pass  # the master's UI is not up yet
            time.sleep(0.3)
        raise TimeoutError(f"waited {START_S} s for {what}\n{self.logs()}")

    def executor_logs(self, worker: int) -> str:
        """Everything the executors launched by ``worker`` wrote."""
        work = self.root / f"worker-{worker}"
        return "".join(p.read_text(errors="replace") for p in sorted(work.rglob("stderr")))

    def kill_worker(self, worker: int) -> None:
        """SIGKILL the worker and the executors it launched: the machine is gone."""
        process = self._processes[1 + worker]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)

    def stop(self) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)

    def logs(self) -> str:
        return "".join(
            f"--- {p.relative_to(self.root)} ---\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.root.rglob("*.log"))
        )
