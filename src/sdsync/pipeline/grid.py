"""Parameter grids for ``sdsync pipeline sweep``: a TOML file → the simulation runs.

Theory of operation
-------------------
A grid file names a **base** scenario and **sweeps** that vary it::

    [base]                       # a scenario, in the format of scenarios/*.toml
    participants = 10
    [base.network]
    loss = 0.2

    [axes]                       # varied in every sweep (typically the seeds)
    seed = [1, 2, 3]

    [[sweep]]
    name = "loss"
    [sweep.axes]
    "network.loss" = [0.0, 0.1, 0.3]

    [[sweep]]
    name = "store and SDS-R"     # two axes: their cross product
    [sweep.axes]
    stores = [0, 1]
    "protocol.repair" = [true, false]

Each sweep is the cross product of its own axes and the common ones, applied to the
base (an axis is a dotted scenario field, as in ``sdsync simulate``'s overrides).  One
factor at a time around a base keeps the number of runs linear in the factors, where a
single cross product of everything would multiply them.  Points that come out the same
in several sweeps — the base itself, in every sweep — run once and are shared.  Every
point is validated here, on the driver, exactly as ``sdsync simulate`` validates a
scenario, so a typo fails before any executor starts (exit code 2, naming the file).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdsync.errors import InputError, LocalProtocolError
from sdsync.sim.config import SimConfig, config_from_dict
from sdsync.sim.engine import Simulation

Value = bool | int | float | str


@dataclass(frozen=True)
class Sweep:
    name: str
    own: tuple[str, ...]
    """Dotted fields this sweep varies: what its evidence is grouped by."""
    common: tuple[str, ...]
    """The common axes it does not vary itself: replicates (the seeds)."""

    @property
    def axes(self) -> tuple[str, ...]:
        return self.own + self.common


@dataclass(frozen=True)
class Point:
    run: str
    """``r000``, ``r001``, … in the order the runs are scheduled (costliest first)."""
    config: SimConfig
    sweeps: tuple[str, ...]

    @property
    def config_json(self) -> str:
        return json.dumps(dataclasses.asdict(self.config), sort_keys=True)

    def value(self, axis: str) -> Value:
        return axis_value(self.config, axis)


@dataclass(frozen=True)
class Grid:
    path: str
    sweeps: tuple[Sweep, ...]
    points: tuple[Point, ...]
    common_axes: tuple[str, ...]
    description: str = ""

    @property
    def axes(self) -> tuple[str, ...]:
        """Every axis of every sweep, in first-seen order."""
        return tuple(dict.fromkeys(a for s in self.sweeps for a in s.axes))


def axis_value(config: SimConfig, axis: str) -> Value:
    value: Any = config
    for part in axis.split("."):
        value = getattr(value, part)
    return value  # type: ignore[no-any-return]


def column_name(axis: str) -> str:
    """``network.loss`` → ``network_loss``: Spark column names must not contain dots."""
    return axis.replace(".", "_")


def _merge(raw: dict[str, Any], axis: str, value: Value) -> dict[str, Any]:
    *sections, name = axis.split(".")
    merged = dict(raw)
    table = merged
    for section in sections:
        nested = table.get(section, {})
        table[section] = dict(nested) if isinstance(nested, dict) else nested
        table = table[section]
    table[name] = value
    return merged


def _axes(path: str, where: str, raw: Any) -> dict[str, list[Value]]:
    if not isinstance(raw, dict):
        raise InputError(f"{path}: {where} must be a table of axis = [values]", path=path)
    axes: dict[str, list[Value]] = {}
    for axis, values in raw.items():
        if not isinstance(values, list) or not values:
            raise InputError(
                f"{path}: {where} axis '{axis}' needs a non-empty array of values",
                path=path,
                column=axis,
            )
        axes[axis] = values
    return axes


def _config(path: str, raw: dict[str, Any], where: str) -> SimConfig:
    """The validated scenario; the engine itself checks the protocol parameters (it is
    cheap to build: the run is what costs)."""
    try:
        config = config_from_dict(raw)
        Simulation(config, record_events=False)
    except (LocalProtocolError, ValueError) as exc:
        raise InputError(f"{path}: {where}: {exc}", path=path) from None
    return config


def _cost(config: SimConfig) -> float:
    """Roughly proportional to the run time: every broadcast reaches n − 1 receivers."""
    n = config.participants
    return n * (n - 1) * max(1, config.workload.total_messages(n)) * config.channels


def parse_grid(text: str, path: str) -> Grid:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML ({exc})", path=path) from None
    unknown = sorted(set(raw) - {"base", "axes", "sweep", "description"})
    if unknown:
        raise InputError(f"{path}: unknown key(s) {', '.join(unknown)}", path=path)
    base = raw.get("base", {})
    if not isinstance(base, dict):
        raise InputError(f"{path}: [base] must be a table (a scenario)", path=path)
    _config(path, base, "[base]")
    common = _axes(path, "[axes]", raw.get("axes", {}))
    sweeps_raw = raw.get("sweep", [])
    if not isinstance(sweeps_raw, list) or not sweeps_raw:
        raise InputError(f"{path}: needs at least one [[sweep]]", path=path)
    sweeps: list[Sweep] = []
    found: dict[str, tuple[SimConfig, list[str]]] = {}
    for index, sweep in enumerate(sweeps_raw):
        name = sweep.get("name", f"sweep {index + 1}") if isinstance(sweep, dict) else None
        if not isinstance(name, str) or set(sweep) - {"name", "axes"}:
            raise InputError(f"{path}: [[sweep]] {index + 1} takes only name and axes", path=path)
        own = _axes(path, f"[[sweep]] '{name}'", sweep.get("axes", {}))
        replicated = {a: v for a, v in common.items() if a not in own}
        axes = {**own, **replicated}
        sweeps.append(Sweep(name, tuple(own), tuple(replicated)))
        for values in itertools.product(*axes.values()):
            point = base
            for axis, value in zip(axes, values, strict=True):
                point = _merge(point, axis, value)
            where = f"sweep '{name}', " + ", ".join(
                f"{a} = {v!r}" for a, v in zip(axes, values, strict=True)
            )
            config = _config(path, point, where)
            key = json.dumps(dataclasses.asdict(config), sort_keys=True)
            found.setdefault(key, (config, []))[1].append(name)
    names = [s.name for s in sweeps]
    if len(set(names)) != len(names):
        raise InputError(f"{path}: sweep names must be unique", path=path)
    ordered = sorted(found.values(), key=lambda item: -_cost(item[0]))
    points = tuple(
        Point(f"r{i:03d}", config, tuple(dict.fromkeys(in_sweeps)))
        for i, (config, in_sweeps) in enumerate(ordered)
    )
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise InputError(f"{path}: description must be a string", path=path)
    return Grid(path, tuple(sweeps), points, tuple(common), description)


def load_grid(path: Path) -> Grid:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the grid ({exc})", path=str(path)) from None
    return parse_grid(text, str(path))
