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
base (an axis is a dotted scenario field, as in ``sdsync simulate``'s overrides).

A sweep may declare the points that are **expected to break** the invariants — the
comparisons, such as a group with neither a store nor SDS-R under loss::

    [[sweep]]
    name = "store and SDS-R"
    expect_broken = [{ stores = 0, "protocol.repair" = false }]
    [sweep.axes]
    stores = [0, 1]
    "protocol.repair" = [true, false]

Each entry is a set of the sweep's axis values; the sweep's runs made from those values
are expected to break (a run several sweeps share, if any of them says so).  The sweep
reports them apart, and fails only on the runs nobody expected to break.

A **preset** axis sets several fields at once, by name — a factor that is not one field,
such as how participants retrieve what they missed::

    [presets.retrieval]
    catchup = { stores = 1, "protocol.store_catchup" = true }
    sdsr = { stores = 0, "protocol.repair" = true }

    [[sweep]]
    name = "retrieval"
    [sweep.axes]
    retrieval = ["catchup", "sdsr"]

The built-in preset axis ``profile`` sets the protocol fields of the named bandwidth
profiles (:mod:`sdsync.runtime.profiles`).  A run's value on a preset axis is the first
preset whose fields its configuration matches, so points shared between sweeps carry it
too (the base of the grid above is ``catchup``).

**Headlines** are pivot tables over the runs of one sweep — the figures a reader wants
first::

    [[headline]]
    title = "Delivery to everyone"
    sweep = "retrieval"
    rows = "retrieval"
    columns = "protocol.causal_history"
    measure = "delivered_ever"
    where = { "network.loss" = 0.2 }   # optional: only the runs with these axis values  One
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
from sdsync.runtime.profiles import PROFILES
from sdsync.sim.config import SimConfig, config_from_dict, profile_fields
from sdsync.sim.engine import Simulation

Value = bool | int | float | str

Match = tuple[tuple[str, Value], ...]
"""Axis values a run must all have: (axis, value), in the order the grid gives them."""


@dataclass(frozen=True)
class Sweep:
    name: str
    own: tuple[str, ...]
    """Dotted fields this sweep varies: what its evidence is grouped by."""
    common: tuple[str, ...]
    """The common axes it does not vary itself: replicates (the seeds)."""
    expect_broken: tuple[Match, ...] = ()
    """Its points expected to break the invariants (``expect_broken``)."""

    @property
    def axes(self) -> tuple[str, ...]:
        return self.own + self.common


Preset = dict[str, Value]
"""Dotted field → value."""


@dataclass(frozen=True)
class Headline:
    title: str
    sweep: str
    rows: str
    columns: str
    measure: str
    where: tuple[tuple[str, Value], ...] = ()


@dataclass(frozen=True)
class Point:
    run: str
    """``r000``, ``r001``, … in the order the runs are scheduled (costliest first)."""
    config: SimConfig
    sweeps: tuple[str, ...]
    labels: tuple[tuple[str, str | None], ...] = ()
    """(preset axis, the name of the preset this configuration matches)."""
    expected_break: str | None = None
    """Why the run is expected to break the invariants — the ``expect_broken`` entry it
    matches, as ``stores = 0, protocol.repair = false`` — or None: it must keep them."""

    @property
    def expected_to_break(self) -> bool:
        return self.expected_break is not None

    @property
    def config_json(self) -> str:
        return config_json(self.config)

    def value(self, axis: str) -> Value | None:
        for name, label in self.labels:
            if name == axis:
                return label
        return axis_value(self.config, axis)


@dataclass(frozen=True)
class Grid:
    path: str
    sweeps: tuple[Sweep, ...]
    points: tuple[Point, ...]
    common_axes: tuple[str, ...]
    description: str = ""
    headlines: tuple[Headline, ...] = ()

    @property
    def axes(self) -> tuple[str, ...]:
        """Every axis of every sweep, in first-seen order."""
        return tuple(dict.fromkeys(a for s in self.sweeps for a in s.axes))


def axis_value(config: SimConfig, axis: str) -> Value:
    value: Any = config
    for part in axis.split("."):
        value = getattr(value, part)
    return value  # type: ignore[no-any-return]


def config_json(config: SimConfig) -> str:
    """The identity of a run: equal JSON, equal simulation (the same seed replays it)."""
    return json.dumps(dataclasses.asdict(config), sort_keys=True)


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


def _apply(
    raw: dict[str, Any], axis: str, value: Value, presets: dict[str, dict[str, Preset]]
) -> dict[str, Any]:
    if axis not in presets:
        return _merge(raw, axis, value)
    for field, setting in presets[axis][str(value)].items():
        raw = _merge(raw, field, setting)
    return raw


def _label(config: SimConfig, presets: dict[str, Preset]) -> str | None:
    for name, fields in presets.items():
        if all(axis_value(config, f) == v for f, v in fields.items()):
            return name
    return None


def builtin_presets() -> dict[str, dict[str, Preset]]:
    """``profile``: each bandwidth profile's channel parameters as the simulator's fields.

    Its sync timing is left to the grid: simulating a large group whose every member
    syncs every 30 s (js-compatible) is a sync storm no grid can afford, so a grid sets
    ``protocol.sync_ms_per_participant`` for every run and compares the profiles' filters
    and histories under the same sync policy."""
    return {"profile": {name: profile_fields(p, sync=False) for name, p in PROFILES.items()}}


def _presets(path: str, raw: Any) -> dict[str, dict[str, Preset]]:
    presets = builtin_presets()
    if not isinstance(raw, dict):
        raise InputError(
            f"{path}: [presets] must be a table of axis = {{name = {{...}}}}", path=path
        )
    for axis, named in raw.items():
        where = f"[presets.{axis}]"
        if "." in axis or not isinstance(named, dict) or not named:
            raise InputError(
                f"{path}: {where} needs a dot-free axis name and at least one preset", path=path
            )
        for name, fields in named.items():
            if not isinstance(fields, dict) or not fields:
                raise InputError(
                    f"{path}: {where} {name} must be a table of field = value", path=path
                )
        presets[axis] = {name: dict(fields) for name, fields in named.items()}
    return presets


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


def same_value(a: Value, b: Value) -> bool:
    """Equal as grid values: ``0`` and ``0.0`` are, ``0`` and ``false`` are not (Python's
    ``0 == False`` would let ``stores = false`` match the runs without a store)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _written(value: Any) -> str:
    """A value as a grid file writes it (JSON's scalars are TOML's)."""
    return json.dumps(value, default=str)


def describe(match: Match) -> str:
    """``stores = 0, protocol.repair = false``."""
    return ", ".join(f"{axis} = {_written(value)}" for axis, value in match)


def _expect_broken(
    path: str, sweep: str, raw: Any, axes: dict[str, list[Value]]
) -> tuple[Match, ...]:
    """A sweep's ``expect_broken``: each entry a table of some of its axes' values."""
    where = f"{path}: [[sweep]] '{sweep}': expect_broken"
    if not isinstance(raw, list) or not all(isinstance(e, dict) and e for e in raw):
        raise InputError(
            f"{where} must be an array of tables of axis = value, e.g. "
            '[{ stores = 0, "protocol.repair" = false }]',
            path=path,
            column="expect_broken",
        )
    matches = []
    for entry in raw:
        for axis, value in entry.items():
            if axis not in axes:
                raise InputError(
                    f"{where}: {axis!r} is not an axis of this sweep (its axes: {', '.join(axes)})",
                    path=path,
                    column=axis,
                )
            # Among the sweep's values, so the entry matches some of its runs: a value
            # no run has (a typo, "false" for false) would expect nothing, silently.
            if not any(same_value(value, v) for v in axes[axis]):
                raise InputError(
                    f"{where}: {axis} = {_written(value)} is not one of the sweep's values "
                    f"({', '.join(_written(v) for v in axes[axis])})",
                    path=path,
                    column=axis,
                )
        matches.append(tuple(entry.items()))
    return tuple(matches)


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
    unknown = sorted(set(raw) - {"base", "axes", "sweep", "description", "presets", "headline"})
    if unknown:
        raise InputError(f"{path}: unknown key(s) {', '.join(unknown)}", path=path)
    base = raw.get("base", {})
    if not isinstance(base, dict):
        raise InputError(f"{path}: [base] must be a table (a scenario)", path=path)
    _config(path, base, "[base]")
    presets = _presets(path, raw.get("presets", {}))
    common = _axes(path, "[axes]", raw.get("axes", {}))
    sweeps_raw = raw.get("sweep", [])
    if not isinstance(sweeps_raw, list) or not sweeps_raw:
        raise InputError(f"{path}: needs at least one [[sweep]]", path=path)
    sweeps: list[Sweep] = []
    # configuration JSON → the configuration, the sweeps it is in, why it should break
    found: dict[str, tuple[SimConfig, list[str], list[str]]] = {}
    for index, sweep in enumerate(sweeps_raw):
        name = sweep.get("name", f"sweep {index + 1}") if isinstance(sweep, dict) else None
        if not isinstance(name, str) or set(sweep) - {"name", "axes", "expect_broken"}:
            raise InputError(
                f"{path}: [[sweep]] {index + 1} takes only name, axes and expect_broken",
                path=path,
            )
        own = _axes(path, f"[[sweep]] '{name}'", sweep.get("axes", {}))
        for axis, axis_values in own.items():
            strangers = [v for v in axis_values if axis in presets and str(v) not in presets[axis]]
            if strangers:
                raise InputError(
                    f"{path}: [[sweep]] '{name}': no preset {strangers[0]!r} for axis "
                    f"{axis} (known: {', '.join(presets[axis])})",
                    path=path,
                    column=axis,
                )
        replicated = {a: v for a, v in common.items() if a not in own}
        axes = {**own, **replicated}
        expected = _expect_broken(path, name, sweep.get("expect_broken", []), axes)
        sweeps.append(Sweep(name, tuple(own), tuple(replicated), expected))
        for values in itertools.product(*axes.values()):
            point = base
            for axis, value in zip(axes, values, strict=True):
                point = _apply(point, axis, value, presets)
            where = f"sweep '{name}', " + ", ".join(
                f"{a} = {v!r}" for a, v in zip(axes, values, strict=True)
            )
            config = _config(path, point, where)
            _, in_sweeps, why = found.setdefault(config_json(config), (config, [], []))
            in_sweeps.append(name)
            chosen = dict(zip(axes, values, strict=True))
            why.extend(
                describe(match)
                for match in expected
                if all(same_value(chosen[a], v) for a, v in match)
            )
    names = [s.name for s in sweeps]
    if len(set(names)) != len(names):
        raise InputError(f"{path}: sweep names must be unique", path=path)
    ordered = sorted(found.values(), key=lambda item: -_cost(item[0]))
    used = [a for a in presets if any(a in s.own for s in sweeps)]
    points = tuple(
        Point(
            f"r{i:03d}",
            config,
            tuple(dict.fromkeys(in_sweeps)),
            tuple((a, _label(config, presets[a])) for a in used),
            why[0] if why else None,
        )
        for i, (config, in_sweeps, why) in enumerate(ordered)
    )
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise InputError(f"{path}: description must be a string", path=path)
    headlines = _headlines(path, raw.get("headline", []), sweeps)
    return Grid(path, tuple(sweeps), points, tuple(common), description, headlines)


def _headlines(path: str, raw: Any, sweeps: list[Sweep]) -> tuple[Headline, ...]:
    fields = ["title", "sweep", "rows", "columns", "measure"]
    if not isinstance(raw, list):
        raise InputError(f"{path}: headlines are [[headline]] tables", path=path)
    headlines = []
    for index, table in enumerate(raw):
        where = f"{path}: [[headline]] {index + 1}"
        if not isinstance(table, dict) or sorted(set(table) - {"where"}) != sorted(fields):
            raise InputError(
                f"{where} takes exactly {', '.join(fields)}, and optionally where", path=path
            )
        only = table.get("where", {})
        if not isinstance(only, dict):
            raise InputError(f"{where}: where must be a table of axis = value", path=path)
        headline = Headline(**{f: str(table[f]) for f in fields}, where=tuple(only.items()))
        sweep = next((s for s in sweeps if s.name == headline.sweep), None)
        if sweep is None:
            raise InputError(f"{where}: no sweep named {headline.sweep!r}", path=path)
        for axis in (headline.rows, headline.columns, *only):
            if axis not in sweep.axes:
                raise InputError(
                    f"{where}: {axis!r} is not an axis of sweep {sweep.name!r}", path=path
                )
        headlines.append(headline)
    return tuple(headlines)


def load_grid(path: Path) -> Grid:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the grid ({exc})", path=str(path)) from None
    return parse_grid(text, str(path))
