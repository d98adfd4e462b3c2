"""The demos: the whole system end to end (full), and the core engines on a toy network
(quick); with the console runner of a simulation that ``sdsync simulate`` shares."""

from sdsync.demo.full import OFFLINE_MS, OUTAGE_MS, FullDemo, demo_scenario, run_full_demo
from sdsync.demo.quick import QuickDemo, run_quick_demo
from sdsync.demo.simulation import InvalidScenarioError, run_simulation

__all__ = [
    "OFFLINE_MS",
    "OUTAGE_MS",
    "FullDemo",
    "InvalidScenarioError",
    "QuickDemo",
    "demo_scenario",
    "run_full_demo",
    "run_quick_demo",
    "run_simulation",
]
