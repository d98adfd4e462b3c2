"""``make check``'s selection: the tests that start no process, found without a list.

Every test that starts a process (node, an ``sdsync`` CLI process, go-waku, nwaku,
PostgreSQL, Chromium through Playwright, Spark's JVM, another Python) gets the
``processes`` marker at collection, in every run; ``--no-processes`` (``make check``)
deselects those tests. A test is marked when

- it carries the ``interop`` marker or a ``many-processes`` or ``spark`` xdist group
  (tests/pipeline/conftest.py puts every pipeline test in the latter);
- a parameter of it is ``"postgresql"`` (the archive's backends), or names a fixture that
  starts processes (``request.getfixturevalue(backend)``);
- or its function, a fixture it uses (with their fixtures), or a parameter it is given
  reaches, through the project's own code (``src/``, ``tests/``), a name that starts
  processes: ``subprocess``, ``multiprocessing``, ``asyncio.create_subprocess_exec``,
  ``os.fork``, Spark (``pyspark``, ``py4j``) or Playwright.

That last test reads code, not behaviour, and may miss a call made through a name it cannot
follow (``getattr``, a registry, a string). So ``--no-processes`` also watches every
process start during a test (an audit hook: ``subprocess.Popen``, ``os.fork``,
``os.posix_spawn``, ``os.system``, ``os.exec*``): one fails that test, saying to mark it
``@pytest.mark.processes``. The selection cannot go stale silently: a test it misses fails.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

MARKER = "processes"
OPTION = "--no-processes"

# Markers and xdist groups that mean processes (pyproject.toml's markers; the modules'
# pytestmark), and parameter values naming a backend served by a process.
_PROCESS_MARKERS = {"interop"}
_PROCESS_GROUPS = {"many-processes", "spark"}
_PROCESS_VALUES = {"postgresql"}

# What starts a process: these modules (and any module under them), and these names
# wherever they are read (``asyncio.create_subprocess_exec``, ``os.fork``...).
_SPAWNING_MODULES = (
    "subprocess",
    "multiprocessing",
    "pty",
    "concurrent.futures.process",
    "asyncio.subprocess",
    "pyspark",
    "py4j",
    "playwright",
)
_SPAWNING_NAMES = {
    "Popen",
    "ProcessPoolExecutor",
    "create_subprocess_exec",
    "create_subprocess_shell",
    "fork",
    "forkpty",
    "posix_spawn",
    "posix_spawnp",
    "spawnl",
    "spawnle",
    "spawnlp",
    "spawnlpe",
    "spawnv",
    "spawnve",
    "spawnvp",
    "spawnvpe",
    "execl",
    "execle",
    "execlp",
    "execlpe",
    "execv",
    "execve",
    "execvp",
    "execvpe",
}
# The audit events of a process start (https://docs.python.org/3/library/audit_events.html).
_SPAWN_EVENTS = {
    "subprocess.Popen",
    "os.fork",
    "os.forkpty",
    "os.posix_spawn",
    "os.spawn",
    "os.exec",
    "os.system",
    "pty.spawn",
}


def _spawning_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in _SPAWNING_MODULES)


class _Reader:
    """Whether an object's code reaches a process start, following the project's code."""

    def __init__(self, roots: Iterable[Path]) -> None:
        self._roots = [str(root.resolve()) for root in roots]
        self._seen: dict[int, bool] = {}
        self._keep: list[Any] = []  # what _seen's ids belong to, kept alive
        self._ours: dict[str, bool] = {}

    def _ours_module(self, name: str | None) -> bool:
        """A module of this project (src/ or tests/), not of the standard library or a
        dependency (.venv, even when it sits inside the checkout)."""
        if not name:
            return False
        if name not in self._ours:
            module = sys.modules.get(name)
            path = getattr(module, "__file__", None) or ""
            self._ours[name] = (
                bool(path)
                and any(path.startswith(root) for root in self._roots)
                and "site-packages" not in path
            )
        return self._ours[name]

    def spawns(self, obj: Any) -> bool:
        key = id(obj)
        if key in self._seen:
            return self._seen[key]
        self._seen[key] = False  # a cycle adds nothing
        self._keep.append(obj)
        found = self._spawns(obj)
        self._seen[key] = found
        return found

    def _spawns(self, obj: Any) -> bool:
        if isinstance(obj, types.ModuleType):
            return _spawning_module(obj.__name__)
        if isinstance(obj, (staticmethod, classmethod)):
            return self.spawns(obj.__func__)
        if isinstance(obj, property):
            return any(self.spawns(f) for f in (obj.fget, obj.fset, obj.fdel) if f)
        if isinstance(obj, types.MethodType):
            return self.spawns(obj.__func__)
        if isinstance(obj, functools.partial):
            return self.spawns(obj.func) or any(self.spawns(a) for a in obj.args)
        module = getattr(obj, "__module__", None)
        if not isinstance(module, str):
            return False
        if _spawning_module(module):
            return True
        if not self._ours_module(module):
            return False
        if isinstance(obj, types.FunctionType):
            return self._function(inspect.unwrap(obj))
        if isinstance(obj, type):
            return any(self.spawns(base) for base in obj.__bases__) or any(
                self.spawns(value) for value in vars(obj).values()
            )
        return False

    def _function(self, function: types.FunctionType) -> bool:
        names = set(_names(function.__code__))
        if names & _SPAWNING_NAMES or any(_spawning_module(n) for n in names):
            return True
        if "system" in names and "os" in names:
            return True
        scope = function.__globals__
        reached: list[Any] = [scope[n] for n in names if n in scope]
        reached += [cell.cell_contents for cell in function.__closure__ or () if _full(cell)]
        reached += list(function.__defaults__ or ())
        # Attributes of our modules: `storeprocess.store_serve`, `sdsync.testing.pgcluster`.
        modules = [m for m in reached if isinstance(m, types.ModuleType)]
        while modules:
            module = modules.pop()
            if _spawning_module(module.__name__):
                return True
            if not self._ours_module(module.__name__):
                continue
            for name in names:
                value = getattr(module, name, None)
                if isinstance(value, types.ModuleType):
                    if value not in modules and value is not module:
                        modules.append(value)
                elif value is not None:
                    reached.append(value)
        return any(self.spawns(value) for value in reached if not _plain(value))


def _names(code: types.CodeType) -> Iterator[str]:
    """The global and attribute names a code object and the code inside it read (imports
    included: ``import subprocess`` names ``subprocess``)."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _full(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def _plain(value: Any) -> bool:
    return isinstance(value, (str, bytes, int, float, bool, type(None)))


def _reasons(item: pytest.Item, reader: _Reader) -> Iterator[str]:
    for mark in item.iter_markers():
        if mark.name in _PROCESS_MARKERS:
            yield f"marked {mark.name}"
        elif mark.name == "xdist_group":
            group = mark.args[0] if mark.args else mark.kwargs.get("name")
            if group in _PROCESS_GROUPS:
                yield f"xdist group {group}"
    callspec = getattr(item, "callspec", None)
    params: dict[str, Any] = dict(callspec.params) if callspec else {}
    for name, value in params.items():
        if isinstance(value, str):
            if value in _PROCESS_VALUES:
                yield f"{name}={value}"
            elif _fixture_spawns(item, value, reader, set()):
                yield f"{name}={value}, a fixture"  # request.getfixturevalue(value)
        elif not _plain(value) and reader.spawns(value):
            yield f"parameter {name}"
    function = getattr(item, "function", None)
    if function is not None and reader.spawns(function):
        yield "its code"
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs if info is not None else {}
    for name in getattr(item, "fixturenames", ()):
        for definition in definitions.get(name, ())[-1:]:
            if reader.spawns(definition.func):
                yield f"fixture {name}"


def _fixture(item: pytest.Item, name: str) -> list[Any]:
    """The definition of fixture ``name`` seen from ``item`` (empty if none)."""
    manager = getattr(item.session, "_fixturemanager", None)
    try:
        definitions = manager.getfixturedefs(name, item) if manager else None
    except Exception:  # a private API: an older or newer pytest may differ
        return []
    return list(definitions or ())[-1:]


def _fixture_spawns(item: pytest.Item, name: str, reader: _Reader, seen: set[str]) -> bool:
    """Whether fixture ``name``, or a fixture it uses, starts processes."""
    seen.add(name)
    return any(
        reader.spawns(definition.func)
        or any(
            _fixture_spawns(item, arg, reader, seen)
            for arg in definition.argnames
            if arg not in seen
        )
        for definition in _fixture(item, name)
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        action="store_true",
        help="run only the tests that start no process (make check); fail one that does",
    )


# Not tryfirst: after tests/pipeline/conftest.py's (tryfirst) has put the Spark tests in
# their group; still before -m (a builtin plugin's, called last) reads the marker.
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reader = _Reader([config.rootpath / "src", config.rootpath / "tests"])
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        if item.get_closest_marker(MARKER) is None:
            reason = next(_reasons(item, reader), None)
            if reason is not None:
                item.add_marker(pytest.mark.processes(reason=reason))
        (dropped if item.get_closest_marker(MARKER) else kept).append(item)
    if config.getoption(OPTION) and dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# What the run left out, for its summary. Under xdist the workers select; the first one's
# count reaches the controller in its workeroutput.
_left_out = pytest.StashKey[Counter[str]]()
_LEFT_OUT = {MARKER: "that start processes", "slow": "slow (tests/quickcheck.py)"}


def pytest_deselected(items: list[pytest.Item]) -> None:
    for item in items:
        for marker in _LEFT_OUT:
            if item.get_closest_marker(marker) is not None:
                item.config.stash.setdefault(_left_out, Counter())[marker] += 1
                break


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["sdsync_left_out"] = dict(session.config.stash.get(_left_out, {}))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    left_out = getattr(node, "workeroutput", {}).get("sdsync_left_out")
    if left_out:
        node.config.stash.setdefault(_left_out, Counter(left_out))


@pytest.hookimpl(trylast=True)  # after the count per directory (conftest.py)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    left_out = terminalreporter.config.stash.get(_left_out, None)
    if left_out:
        counts = ", ".join(f"{left_out[m]} {what}" for m, what in _LEFT_OUT.items() if left_out[m])
        terminalreporter.write_line(f"Tests not run: {counts}; make test runs them.")


# The guard: under --no-processes, a process started while a test runs fails that test.
_running: list[str] = []  # the nodeid of the test running, while one is
_started: dict[str, list[str]] = {}  # nodeid -> what it started


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _running or event not in _SPAWN_EVENTS:
        return
    what = event
    if event == "subprocess.Popen" and len(args) > 1:
        what = f"{event} {args[1]!r}"[:300]
    _started.setdefault(_running[0], []).append(what)
    raise pytest.fail.Exception(_message(_running[0], [what]), pytrace=False)


def _message(nodeid: str, started: list[str]) -> str:
    return (
        f"{nodeid} started a process under {OPTION} (make check): {'; '.join(started)}. "
        f"tests/noprocess.py did not see it coming: mark the test "
        f"@pytest.mark.{MARKER}, so that make check leaves it to make test."
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}: starts processes (node, sdsync, go-waku, nwaku, PostgreSQL, Chromium, "
        f"Spark): make check ({OPTION}) leaves it out; set by tests/noprocess.py",
    )
    if config.getoption(OPTION):
        sys.addaudithook(_audit)  # cannot be removed: it acts only while a test runs


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    armed = item.config.getoption(OPTION)
    if armed:
        _running[:] = [item.nodeid]
    try:
        return (yield)
    finally:
        _running.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report: pytest.TestReport = yield
    started = _started.pop(item.nodeid, None)
    if started and not report.failed:  # the code under test caught the failure
        report.outcome = "failed"
        report.longrepr = _message(item.nodeid, started)
    return report
