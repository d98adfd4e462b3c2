"""What makes ``make check``'s tests quick: few Hypothesis examples, no load tests.

``--max-examples N`` caps every Hypothesis test of the run at N examples: ``@given`` tests
(their own ``@settings`` included), state machines (``run_state_machine_as_test`` and
their ``TestCase``), and every test left at the default profile. Most of the suite's own
time is its property tests at 150 to 2,000 examples each; ``make test`` runs each at the
count its module sets, ``make check`` at a few, which still replays the failures
Hypothesis has saved (``.hypothesis/``).

``slow`` marks a load test: one that takes over 5 s of CPU on its own, whatever the cap
(60,000 archived messages, 100 light clients, 300 connections); every other test of
``make check`` takes under 3. ``make check`` leaves them to ``make test`` (``-m "not
slow"``). Mark one in its module with ``@pytest.mark.slow``; :data:`SLOW` names those
marked from here, and a name in it that no longer matches a test is reported as a warning.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

OPTION = "--max-examples"

SLOW = (
    "tests/store/test_sync_riblt_hostile.py::test_an_unread_stream_is_cancelled_when_its_session_expires",
    "tests/store/test_light_load.py::test_a_store_node_pushes_every_message_to_100_light_clients",
    "tests/transport/test_libp2p_hostile.py::test_connections_opened_and_closed_free_their_slots",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        type=int,
        default=None,
        metavar="N",
        help="cap every Hypothesis test at N examples (make check; make test runs them all)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: a load test, over 5 s of CPU (make check leaves it out; tests/quickcheck.py)",
    )
    cap = config.getoption(OPTION)
    if cap is not None:
        _cap_hypothesis(cap)


def _capped(current: Any, cap: int) -> Any:
    """``current`` (Hypothesis settings) with at most ``cap`` examples; None if it has."""
    from hypothesis import settings

    if isinstance(current, settings) and current.max_examples > cap:
        return settings(current, max_examples=cap)
    return None


def _cap_hypothesis(cap: int) -> None:
    from hypothesis import settings, stateful

    # Settings made from the default profile from now on: tests without @settings, and
    # state machines run without settings of their own.
    settings.register_profile("sdsync-max-examples", settings.default, max_examples=cap)
    settings.load_profile("sdsync-max-examples")
    # Settings given to a state machine: run_state_machine_as_test(..., settings=...) and
    # each RuleBasedStateMachine.TestCase go through this function (Hypothesis 6).
    build = getattr(stateful, "get_state_machine_test", None)
    if build is None:
        return

    def capped_build(factory: Any, *, settings: Any = None, **kwargs: Any) -> Any:
        if settings is None:
            settings = getattr(getattr(factory, "TestCase", None), "settings", None)
        return build(factory, settings=_capped(settings, cap) or settings, **kwargs)

    stateful.get_state_machine_test = capped_build


@pytest.hookimpl(tryfirst=True)  # before -m reads the slow marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _mark_slow(config, items)
    cap = config.getoption(OPTION)
    if cap is None:
        return
    for item in items:
        # @given keeps the settings it was decorated with here, and reads them at each call.
        test = getattr(item, "obj", None)
        test = getattr(test, "__func__", test)
        capped = _capped(getattr(test, "_hypothesis_internal_use_settings", None), cap)
        if capped is not None:
            test._hypothesis_internal_use_settings = capped


def _mark_slow(config: pytest.Config, items: list[pytest.Item]) -> None:
    modules: dict[str, Any] = {}
    for item in items:
        name = item.nodeid.split("[", 1)[0]
        modules.setdefault(name.split("::", 1)[0], getattr(item, "module", None))
        if name in SLOW:
            item.add_marker(pytest.mark.slow)
    for name in SLOW:  # a test renamed or moved away: its entry here is stale
        path, _, qualname = name.partition("::")
        module = modules.get(path)
        if not Path(config.rootpath, path).exists() or (
            module is not None and not _has(module, qualname)
        ):
            warnings.warn(
                pytest.PytestWarning(f"tests/quickcheck.py: SLOW names {name}, no such test"),
                stacklevel=1,
            )


def _has(obj: Any, qualname: str) -> bool:
    for part in qualname.split("::"):
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return True
