"""Optional test dependencies: skipped when missing locally, a failure in CI.

``pytest.importorskip`` turns a broken install into skips, and CI stays green while whole
test modules silently stop running. :func:`require` skips only where ``CI`` is unset.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}


def require(module: str, reason: str) -> ModuleType:
    """``module``, imported; if it cannot be, a skip locally and a failure in CI."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        message = f"cannot import {module} ({reason}): {type(exc).__name__}: {exc}"
        if in_ci():
            pytest.fail(
                f"{message}; CI is set, so every test dependency must be installed", pytrace=False
            )
        pytest.skip(message, allow_module_level=True)
