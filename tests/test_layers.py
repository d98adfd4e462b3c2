"""Imports point down the layers only (docs/architecture.md, the house rules).

cli / testing → demo → pipeline → sim / chat / peer / reliability → store / runtime →
transport / reconcile → core → wire → errors / lifecycle.
Every ``sdsync.<component>`` import in the source, including those inside functions and
``TYPE_CHECKING`` blocks, must name the importing component itself or one below it;
components that share a layer do not import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "sdsync"
LAYERS = (
    ("cli", "testing"),
    ("demo",),
    ("pipeline",),
    ("sim", "chat", "peer", "reliability"),
    ("store", "runtime"),
    ("transport", "reconcile"),
    ("core",),
    ("wire",),
    ("errors", "lifecycle"),
)
RANK = {component: rank for rank, layer in enumerate(LAYERS) for component in layer}


def component(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "sdsync" else None


def imports(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def upward_imports(src: Path = SRC) -> list[str]:
    wrong = []
    for path in sorted(src.rglob("*.py")):
        module = ".".join(("sdsync", *path.relative_to(src).with_suffix("").parts))
        mine = component(module)
        if mine in (None, "__init__"):
            continue
        for target in imports(path):
            theirs = component(target)
            if theirs is None or theirs == mine:
                continue
            if mine not in RANK or theirs not in RANK or RANK[theirs] <= RANK[mine]:
                wrong.append(f"{module} imports {target}")
    return wrong


def test_imports_point_down_the_layers() -> None:
    assert upward_imports() == []


def test_every_component_has_a_layer() -> None:
    components = {p.stem if p.is_file() else p.name for p in SRC.iterdir()}
    components -= {"__init__", "py", "__pycache__"}
    assert components - {"py.typed"} <= RANK.keys()


def test_the_check_catches_upward_and_sideways_imports(tmp_path: Path) -> None:
    (tmp_path / "sim").mkdir()
    (tmp_path / "store").mkdir()
    (tmp_path / "sim" / "output.py").write_text(
        "from sdsync.store.schema import ARCHIVE_SCHEMA\n"  # down: fine
        "def f():\n    from sdsync.pipeline.io import SUMMARY\n"  # up, inside a function
    )
    (tmp_path / "store" / "node.py").write_text("import sdsync.runtime.driver\n")  # sideways
    assert upward_imports(tmp_path) == [
        "sdsync.sim.output imports sdsync.pipeline.io",
        "sdsync.store.node imports sdsync.runtime.driver",
    ]


def library_imports_of_testing(src: Path = SRC) -> list[str]:
    """Modules outside ``sdsync.testing`` that import it: test tooling stays out of the
    library (tests, benchmarks and ``make fuzz`` use it)."""
    found = []
    for path in sorted(src.rglob("*.py")):
        module = ".".join(("sdsync", *path.relative_to(src).with_suffix("").parts))
        if component(module) == "testing":
            continue
        found += [f"{module} imports {t}" for t in imports(path) if component(t) == "testing"]
    return found


def test_the_library_never_imports_its_test_tooling(tmp_path: Path) -> None:
    assert library_imports_of_testing() == []
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "main.py").write_text("from sdsync.testing.gowaku import GoWaku\n")
    assert library_imports_of_testing(tmp_path) == ["sdsync.cli.main imports sdsync.testing.gowaku"]
