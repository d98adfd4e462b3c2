"""Differential conformance: the same seeded lossy groups run with @waku/sds, mixed and ours.

Each scenario (seed x causal history x loss) runs three ways, all driven only through the
`peer --stdio` JSON-lines contract (see group.py): four @waku/sds 0.0.8 peers, two of
those with two of ours, and four of ours. Our peers are `python -m sdsync.cli peer
--stdio` processes in the first seed's scenarios (ids ending in -cli) and the same
PeerSession in-process elsewhere. Per scenario we require that

* our peers never end without a message whose id reached them in a causal history;
* the mixed and all-sdsync groups converge wherever the all-JS group does;
* wherever groups converge, their logs are identical and in (Lamport, id) order.

test_convergence_table prints how often each group kind converged (shown with ``-s``, or
with ``-rA`` under xdist) and writes it to differential_table.txt in pytest's base temp
directory. To print the table without pytest: ``python -m tests.interop.test_differential``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from group import JS_DRIVER, GroupKind, GroupOutcome, Scenario, ScenarioOutcome, run_scenario

# One worker runs every scenario once: the per-scenario tests and the table share results.
pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("differential")]

SEEDS = (1, 2, 3, 4)
CAUSAL_HISTORIES = (2, 3, 200)
LOSSES = (0.0, 0.2, 0.4)
# The first seed runs our peers as real `sdsync peer --stdio` processes, the rest in-process.
SCENARIOS = [
    Scenario(seed, ch, loss, cli=seed == SEEDS[0])
    for seed in SEEDS
    for ch in CAUSAL_HISTORIES
    for loss in LOSSES
]
OURS = (GroupKind.MIXED, GroupKind.SDSYNC)


def unheeded(outcome: ScenarioOutcome, implementation: str = "py") -> dict[str, list[str]]:
    """Peers of one implementation that ended without ids they heard of in a causal history."""
    return {
        f"{group.kind.name}:{name}": ids
        for group in outcome.groups.values()
        for name, ids in group.unheeded(implementation).items()
    }


def unheeded_note(outcome: ScenarioOutcome, implementation: str) -> str:
    missing = unheeded(outcome, implementation)
    return " ".join(f"{who}({len(ids)})" for who, ids in missing.items()) or "-"


def lagging(outcome: ScenarioOutcome) -> list[str]:
    """Groups with sdsync peers that did not converge although the all-JS group did."""
    if not outcome[GroupKind.JS].converged:
        return []
    return [kind.value for kind in OURS if not outcome[kind].converged]


def log_disagreements(outcome: ScenarioOutcome) -> list[str]:
    """Converged groups whose logs are out of (Lamport, id) order or differ from another's."""
    converged = [outcome[kind] for kind in GroupKind if outcome[kind].converged]
    problems = [
        f"{group.kind.value}: {name} out of order"
        for group in converged
        for name in group.disordered()
    ]
    if len({group.logs[0] for group in converged}) > 1:
        problems.append(
            "converged groups hold different logs: "
            + ", ".join(group.kind.value for group in converged)
        )
    return problems


def verdict(group: GroupOutcome) -> str:
    """Whether it converged, and after how many rounds it stopped."""
    return f"{'yes' if group.converged else 'no'} r{group.rounds}"


def describe(outcome: ScenarioOutcome) -> str:
    """Per group: the verdict and, per peer, how many of the sent messages it lacks."""
    lines = []
    for group in outcome.groups.values():
        lacking = ", ".join(
            f"{impl}:{name} -{len(group.sent) - len(set(log) & group.sent)}"
            for name, impl, log in zip(group.names, group.implementations, group.logs, strict=True)
        )
        lines.append(f"{group.kind.value}: {verdict(group)}; lacking {lacking}")
    return "\n".join(lines)


def convergence_table(outcomes: list[ScenarioOutcome]) -> str:
    kinds = list(GroupKind)
    lines = ["Convergence per group kind (converged scenarios / all):"]
    for kind in kinds:
        count = sum(outcome[kind].converged for outcome in outcomes)
        lines.append(f"  {kind.value:<24} {count:>3} / {len(outcomes)}")
    header = f"  {'scenario':<24}" + "".join(f"{kind.name:>10}" for kind in kinds)
    # JS peers that miss ids they heard of are only recorded: the reference is not on trial.
    lines += ["", f"{header}   {'heard of but missing: ours':<32} js (recorded only)"]
    for outcome in outcomes:
        cells = "".join(f"{verdict(outcome[kind]):>10}" for kind in kinds)
        ours, js = unheeded_note(outcome, "py"), unheeded_note(outcome, "js")
        lines.append(f"  {outcome.scenario!s:<24}{cells}   {ours:<32} {js}")
    return "\n".join(lines)


class Outcomes:
    """Each scenario runs once per module, on first demand."""

    def __init__(self) -> None:
        self._done: dict[Scenario, ScenarioOutcome] = {}

    def __getitem__(self, scenario: Scenario) -> ScenarioOutcome:
        if scenario not in self._done:
            self._done[scenario] = run_scenario(scenario)
        return self._done[scenario]


@pytest.fixture(scope="module")
def outcomes() -> Outcomes:
    if shutil.which("node") is None:
        pytest.fail("Node.js is required for interop tests (make test installs the JS driver)")
    if not (JS_DRIVER.parent / "node_modules" / "@waku" / "sds").is_dir():
        pytest.fail(f"@waku/sds is not installed: run `npm ci` in {JS_DRIVER.parent}")
    return Outcomes()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_our_peers_end_with_every_message_they_heard_of(
    outcomes: Outcomes, scenario: Scenario
) -> None:
    outcome = outcomes[scenario]
    assert unheeded(outcome) == {}, describe(outcome)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_groups_with_our_peers_converge_wherever_js_does(
    outcomes: Outcomes, scenario: Scenario
) -> None:
    outcome = outcomes[scenario]
    assert lagging(outcome) == [], describe(outcome)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_converged_logs_are_identical_and_in_lamport_order(
    outcomes: Outcomes, scenario: Scenario
) -> None:
    outcome = outcomes[scenario]
    assert log_disagreements(outcome) == [], describe(outcome)


def test_convergence_table(outcomes: Outcomes, tmp_path_factory: pytest.TempPathFactory) -> None:
    results = [outcomes[scenario] for scenario in SCENARIOS]
    table = convergence_table(results)
    path = tmp_path_factory.getbasetemp() / "differential_table.txt"
    path.write_text(table + "\n")
    print(f"\n{table}\n(written to {path})")
    # Without loss every implementation must converge; if one does not, the harness is
    # broken and the verdicts above mean nothing.
    stuck = [
        f"{outcome.scenario}: {kind.value}"
        for outcome in results
        if outcome.scenario.loss == 0
        for kind in GroupKind
        if not outcome[kind].converged
    ]
    assert stuck == [], table


def main() -> int:
    results = [run_scenario(scenario) for scenario in SCENARIOS]
    print(convergence_table(results))
    failures = [
        f"{outcome.scenario}: {problem}"
        for outcome in results
        for problem in [
            *(f"{who} never got {ids}" for who, ids in unheeded(outcome).items()),
            *(f"{kind} did not converge, all-JS did" for kind in lagging(outcome)),
            *log_disagreements(outcome),
        ]
    ]
    print("\n".join(["", "Failures:", *failures] if failures else ["", "No failures."]))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
