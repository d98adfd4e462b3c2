"""Shared test helpers (see also testdeps.py) and a per-directory count of the tests run.

The count at the end of every run shows, directory by directory, what was collected and
how it ended: a directory whose tests silently stopped running stands out. Under xdist it
is counted on the controller, from the workers' collections and reports.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# make check's selection: the processes and slow markers, --no-processes and --max-examples
# (tests/noprocess.py, tests/quickcheck.py).
pytest_plugins = ["noprocess", "quickcheck"]

_collected = pytest.StashKey[list[str]]()
_OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


def _directory(nodeid: str) -> str:
    """tests/store/test_x.py::test_y -> tests/store; tests/test_x.py -> tests/test_x.py."""
    return "/".join(nodeid.split("::", 1)[0].split("/")[:2])


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.items:  # without xdist (and on its workers, which print no summary)
        session.config.stash[_collected] = [item.nodeid for item in session.items]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    # Every worker collects the whole suite; the first one's ids stand for all.
    node.config.stash.setdefault(_collected, list(ids))


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    collected = Counter(_directory(nodeid) for nodeid in config.stash.get(_collected, []))
    outcomes: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for outcome in _OUTCOMES:
        nodeids = {
            report.nodeid
            for report in terminalreporter.stats.get(outcome, [])
            if getattr(report, "nodeid", None)
        }
        for nodeid in nodeids:
            outcomes[_directory(nodeid)][outcome] += 1
    directories = sorted(set(collected) | set(outcomes))
    if not directories:
        return
    terminalreporter.write_sep("=", "tests per directory")
    width = max(len(d) for d in directories)
    for directory in directories:
        counts = [f"{collected[directory]:5d} collected"]
        counts += [f"{n} {o}" for o in _OUTCOMES if (n := outcomes[directory][o])]
        terminalreporter.write_line(f"{directory:<{width}}  " + ", ".join(counts))


def external_nodes(
    tmp_path: Path, name: str, find: Callable[[], str], unavailable: type[Exception], make: Any
) -> Iterator[Any]:
    """``start(options=None, name=name)``: a running node of another implementation on
    127.0.0.1, ``make(binary, directory, options)`` then its ``wait_up()``; every one
    started is closed after the test. Without its binary (``find()`` raising
    ``unavailable``) the test skips saying how to provide one; in CI it fails."""
    from testdeps import in_ci

    try:
        binary = find()
    except unavailable as exc:
        if in_ci():
            pytest.fail(f"{exc}; CI is set, so {name} must be available", pytrace=False)
        pytest.skip(str(exc))
    started: list[Any] = []

    def start(options: Any = None, name: str = name) -> Any:
        node = make(binary, tmp_path / f"{name}-{len(started)}", options)
        started.append(node)
        try:
            node.wait_up()
        except RuntimeError as exc:
            pytest.fail(str(exc), pytrace=False)
        return node

    try:
        yield start
    finally:
        for node in started:
            node.close()


@pytest.fixture
def go_waku_nodes(tmp_path: Path) -> Iterator[Any]:
    """``start(options=GoWakuOptions(), name="go-waku")``: a running go-waku node on
    127.0.0.1 (its multiaddr in ``.address``), stopped after the test (SDSYNC_GO_WAKU)."""
    from sdsync.testing.gowaku import GoWaku, GoWakuUnavailableError, go_waku_binary

    yield from external_nodes(tmp_path, "go-waku", go_waku_binary, GoWakuUnavailableError, GoWaku)


@pytest.fixture
def nwaku_nodes(tmp_path: Path) -> Iterator[Any]:
    """``start(options=NwakuOptions(), name="nwaku")``: a running nwaku node on 127.0.0.1
    (its multiaddr in ``.address``), stopped after the test (SDSYNC_NWAKU)."""
    from sdsync.testing.nwaku import Nwaku, NwakuUnavailableError, nwaku_binary

    yield from external_nodes(tmp_path, "nwaku", nwaku_binary, NwakuUnavailableError, Nwaku)
