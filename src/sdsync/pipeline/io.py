"""Inputs and outputs of the pipeline: checking Parquet inputs, writing summaries.

Theory of operation: bad input must fail fast, before Spark even starts (seconds: a JVM),
and say exactly which file and which column is wrong (exit code 2).  For local inputs we
therefore read every Parquet footer with pyarrow first — each job's ``check_inputs``, which
the commands call before they build the session: it is cheap (no data pages), it finds
unreadable files, missing columns and wrong types file by file, and it gives each file's
row count and min/max statistics, which the reconciler uses to size its buckets without
a scan.  Inputs on other file systems (``hdfs://``, ``s3a://``) are left to Spark, and
a read error Spark raises later is turned into the same :class:`InputError`
by :func:`input_error_from_spark`.

Data files are what Spark reads in a directory: every file, recursively, except those
whose name starts with ``_`` or ``.`` (``_SUCCESS``, ``.crc``, our fingerprint caches).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from sdsync.errors import InputError

SUMMARY = "summary.json"


@dataclass(frozen=True)
class ColumnSpec:
    """A required (or optional) input column and the Arrow types accepted for it."""

    name: str
    description: str
    accepts: Callable[[pa.DataType], bool]
    required: bool = True


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _is_int64(t: pa.DataType) -> bool:
    return bool(pa.types.is_int64(t))


def _is_binary(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
    )


def _is_bool(t: pa.DataType) -> bool:
    return bool(pa.types.is_boolean(t))


def _is_string_list(t: pa.DataType) -> bool:
    return bool((pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_string(t.value_type))


def string_column(name: str, *, required: bool = True) -> ColumnSpec:
    return ColumnSpec(name, "string", _is_string, required)


def long_column(name: str, *, required: bool = True) -> ColumnSpec:
    return ColumnSpec(name, "int64 (long)", _is_int64, required)


def binary_column(name: str, *, required: bool = True) -> ColumnSpec:
    return ColumnSpec(name, "binary", _is_binary, required)


def bool_column(name: str, *, required: bool = True) -> ColumnSpec:
    return ColumnSpec(name, "boolean", _is_bool, required)


def string_list_column(name: str, *, required: bool = True) -> ColumnSpec:
    return ColumnSpec(name, "array<string>", _is_string_list, required)


# Each kind accepts the Arrow variants Spark reads alike (large strings and lists,
# fixed-size binary) and no two accept the same type, so a declared type picks one kind.
_KINDS = (string_column, long_column, binary_column, bool_column, string_list_column)


def _declared(field: pa.Field, required: bool) -> ColumnSpec:
    for kind in _KINDS:
        spec = kind(field.name, required=required)
        if spec.accepts(field.type):
            return spec
    raise TypeError(f"no input check for column '{field.name}' of type {field.type}")


def schema_columns(
    schema: pa.Schema, *names: str, optional: tuple[str, ...] = ()
) -> list[ColumnSpec]:
    """The checks of the columns ``names`` and ``optional`` (absent allowed), typed as the
    writer's ``schema`` declares them: the writer (the simulator, the store) owns its
    output's shape; a column it renames, or types as nothing here checks, fails at import."""
    return [_declared(schema.field(name), True) for name in names] + [
        _declared(schema.field(name), False) for name in optional
    ]


@dataclass
class ParquetInput:
    """What the footers of one input (a file or a directory of files) say."""

    path: str
    files: list[str] = field(default_factory=list)
    columns: set[str] = field(default_factory=set)
    rows: int | None = None
    """Total rows, or None when not known without Spark (non-local input)."""
    min_max: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    """Per requested column with statistics in every row group: (min, max), or None if
    there are no rows. A column some row group has no statistics for is absent."""


def is_local(path: str) -> bool:
    """Whether pyarrow/os can read ``path`` directly (no scheme, or ``file:``)."""
    return urlparse(path).scheme in ("", "file")


def local_path(path: str) -> Path:
    parsed = urlparse(path)
    return Path(parsed.path if parsed.scheme == "file" else path)


def _hidden(name: str) -> bool:
    return name.startswith(("_", "."))


def list_data_files(path: str) -> list[str]:
    """The files Spark would read for ``path``, sorted; InputError if there are none."""
    root = local_path(path)
    if root.is_file():
        return [str(root)]
    if not root.is_dir():
        raise InputError(f"{path}: no such file or directory", path=path)
    found: list[str] = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not _hidden(d))
        found.extend(os.path.join(directory, f) for f in sorted(files) if not _hidden(f))
    if not found:
        raise InputError(f"{path}: no Parquet files in this directory", path=path)
    return sorted(found)


def _partition_columns(path: str, file: str) -> set[str]:
    # Spark's partition discovery: directories named key=value become columns.
    rel = os.path.relpath(os.path.dirname(file), local_path(path))
    return {part.split("=", 1)[0] for part in Path(rel).parts if "=" in part}


def _check_file(path: str, file: str, specs: list[ColumnSpec]) -> pq.FileMetaData:
    try:
        meta = pq.read_metadata(file)
        schema = meta.schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{file}: not a readable Parquet file ({exc})", path=file) from None
    partition_columns = _partition_columns(path, file)
    for spec in specs:
        if spec.name in partition_columns:
            continue
        index = schema.get_field_index(spec.name)
        if index < 0:
            if spec.required:
                raise InputError(
                    f"{file}: missing column '{spec.name}' ({spec.description})",
                    path=file,
                    column=spec.name,
                )
            continue
        actual = schema.field(index).type
        if not spec.accepts(actual):
            raise InputError(
                f"{file}: column '{spec.name}' is {actual}, expected {spec.description}",
                path=file,
                column=spec.name,
            )
    return meta


Bounds = tuple[int, int] | None
"""(min, max) of a column; None when there are no rows."""


class UnknownBoundsError(Exception):
    """Some row group has no min/max statistics for the column."""


def row_group_bounds(meta: pq.FileMetaData, column: str) -> list[tuple[int, int, int, int]]:
    """(row group, rows, min, max) of an integer column for every non-empty row group of
    one file, from the statistics; UnknownBoundsError if the column or some row group's
    statistics are missing."""
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    if column not in names:
        raise UnknownBoundsError(column)
    index = names.index(column)
    found: list[tuple[int, int, int, int]] = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if group.num_rows == 0:
            continue
        stats = group.column(index).statistics
        if stats is None or not stats.has_min_max:
            raise UnknownBoundsError(column)
        found.append((g, group.num_rows, int(stats.min), int(stats.max)))
    return found


def _column_min_max(meta: pq.FileMetaData, column: str) -> Bounds:
    """(min, max) of an integer column in one file, from the row-group statistics."""
    bounds: Bounds = None
    for _, _, low, high in row_group_bounds(meta, column):
        bounds = _merge_bounds(bounds, (low, high))
    return bounds


def _merge_bounds(a: Bounds, b: Bounds) -> Bounds:
    if a is None:
        return b
    if b is None:
        return a
    return min(a[0], b[0]), max(a[1], b[1])


def inspect_parquet(
    path: str, specs: list[ColumnSpec], *, min_max: tuple[str, ...] = ()
) -> ParquetInput:
    """Check every file of a local input against ``specs``; gather counts and stats.

    Non-local inputs are returned unchecked (``rows`` None): Spark reads them.
    """
    found = ParquetInput(path)
    if not is_local(path):
        return found
    found.files = list_data_files(path)
    rows = 0
    bounds: dict[str, Bounds] = dict.fromkeys(min_max)
    unknown: set[str] = set()
    for file in found.files:
        meta = _check_file(path, file, specs)
        rows += meta.num_rows
        found.columns.update(meta.schema.to_arrow_schema().names)
        found.columns.update(_partition_columns(path, file))
        for column in min_max:
            try:
                bounds[column] = _merge_bounds(bounds[column], _column_min_max(meta, column))
            except UnknownBoundsError:
                unknown.add(column)
    found.rows = rows
    found.min_max = {c: b for c, b in bounds.items() if c not in unknown}
    return found


_SPARK_PATH = re.compile(r"(?:path|file)[^\w/]*((?:file:|hdfs:|s3a?:|gs:|abfss?:)?/[^\s,'\"`\]]+)")


def input_error_from_spark(exc: Exception) -> InputError | None:
    """An InputError if a Spark exception is about an unreadable input, else None."""
    condition = getattr(exc, "getCondition", lambda: None)() or ""
    message = str(exc)
    if not (
        condition.startswith(("FAILED_READ_FILE", "PATH_NOT_FOUND", "UNABLE_TO_INFER_SCHEMA"))
        or "is not a Parquet file" in message
    ):
        return None
    params: Mapping[str, str] = getattr(exc, "getMessageParameters", lambda: {})() or {}
    path = params.get("path")
    if path is None:
        match = _SPARK_PATH.search(message)
        path = match.group(1) if match else None
    first_line = message.strip().splitlines()[0] if message.strip() else condition
    where = f"{path}: " if path else ""
    return InputError(f"{where}cannot read input ({first_line})", path=path)


def write_summary(out: Path, summary: Mapping[str, Any]) -> Path:
    """Write ``summary.json`` beside the command's Parquet outputs."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / SUMMARY
    target.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    return target
