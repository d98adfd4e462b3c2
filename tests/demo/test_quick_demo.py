"""The quick demo (sdsync.demo.quick): ChannelDrivers on a lossy toy network converge."""

from __future__ import annotations

from sdsync.demo import run_quick_demo


def test_a_lossy_group_converges_by_its_drivers_timers() -> None:
    result = run_quick_demo(participants=4, messages=40, loss=0.3, seed=2)
    net = result.network
    assert result.converged and net.lost > 0
    assert sum(m.sent for m in net.members) == 40
    logs = [m.channel.log_ids() for m in net.members]
    assert all(log == logs[0] for log in logs) and len(logs[0]) == 40
    # Whatever was lost reached everyone anyway: by resends, syncs and repairs.
    assert all(m.sent + m.delivered == 40 for m in net.members)


def test_the_same_seed_is_the_same_run() -> None:
    first, again = run_quick_demo(3, 20, 0.2, 7), run_quick_demo(3, 20, 0.2, 7)
    assert (first.virtual_ms, first.network.lost) == (again.virtual_ms, again.network.lost)
    assert first.network.members[0].channel.log_ids() == again.network.members[0].channel.log_ids()


def test_a_group_that_cannot_converge_in_time_says_so() -> None:
    result = run_quick_demo(participants=3, messages=10, loss=0.95, seed=1, max_virtual_ms=1_000)
    assert not result.converged and result.virtual_ms > 1_000
