"""Imports point down the layers only (docs/architecture.md, the house rules).

cli / testing → demo → pipeline → sim / chat / peer / reliability → store / runtime →
transport → waku → reconcile → core → wire → errors / lifecycle / files.
Every ``sdsync.<component>`` import in the source, including those inside functions and
``TYPE_CHECKING`` blocks, must name the importing component itself or one below it;
components that share a layer do not import each other. Within a component no two files
import each other (no circle in the import graph of files), and the libp2p transport's two
threads read no private member of each other's files; the Waku node contract and its
in-memory node import no p2p stack.
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
    ("transport",),
    ("waku",),
    ("reconcile",),
    ("core",),
    ("wire",),
    ("errors", "lifecycle", "files"),
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


# Import circles between files. The layer check above is between components; within one,
# two files that import each other are one module split in two (issue 28).
def module_names(src: Path) -> dict[str, Path]:
    """Dotted name (``sdsync.x.y``; a package's ``__init__`` is the package) -> file."""
    names = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(("sdsync", *parts))] = path
    return names


def imported_modules(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` imports anywhere in its file (functions and
    ``TYPE_CHECKING`` blocks too): ``from pkg import name`` names the submodule
    ``pkg.name`` if there is one, else ``pkg``; relative imports are resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {_known_prefix(alias.name, known) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            origin = _origin(package, node)
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                found.add(submodule if submodule in known else _known_prefix(origin, known))
    found.discard(module)
    return found & known


def _origin(package: str, node: ast.ImportFrom) -> str:
    """The module ``from <origin> import ...`` names, seen from a module of ``package``."""
    if not node.level:
        return node.module or ""
    base = package.rsplit(".", node.level - 1)[0]
    return f"{base}.{node.module}" if node.module else base


def _known_prefix(dotted: str, known: set[str]) -> str:
    while dotted and dotted not in known:
        dotted = dotted.rpartition(".")[0]
    return dotted


def import_circles(src: Path = SRC) -> set[frozenset[str]]:
    """Every strongly connected component of more than one file in the import graph
    (Tarjan's algorithm), named without the ``sdsync.`` prefix."""
    files = module_names(src)
    graph = {m: sorted(imported_modules(m, p, set(files))) for m, p in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: set[frozenset[str]] = set()

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:  # the root of a component: all above it on the stack
            component = {module}
            while (member := stack.pop()) != module:
                component.add(member)
            if len(component) > 1:
                circles.add(frozenset(m.removeprefix("sdsync.") for m in component))

    for module in graph:
        if module not in index:
            visit(module)
    return circles


def test_no_two_files_import_each_other() -> None:
    assert import_circles() == set()


def test_the_circle_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "__init__.py").write_text("")
    (tmp_path / "a" / "one.py").write_text("from . import two\n")  # relative, a submodule
    (tmp_path / "a" / "two.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sdsync.a.three import X\n"
    )
    (tmp_path / "a" / "three.py").write_text("def f():\n    import sdsync.a.one\n")
    (tmp_path / "b.py").write_text("from sdsync.a import one\n")  # into a circle, not in it
    (tmp_path / "c.py").write_text("from .d import Y\n")
    (tmp_path / "d.py").write_text("from sdsync import c\n")
    assert import_circles(tmp_path) == {
        frozenset({"a.one", "a.two", "a.three"}),
        frozenset({"c", "d"}),
    }


# Private members across files: no module reads what another keeps private (the
# transport's two threads, for one, share a HostState in transport/libp2p_shared.py).
# The one module that patches py-libp2p reaches into its internals by design.
PATCHES = "transport/libp2p_patches.py"


def private_members(tree: ast.AST) -> set[str]:
    """The private names a file's classes define: ``self._x = ...`` and ``def _x``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names |= {
                item.name
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def foreign_private_reads(
    folder: Path, files: tuple[str, ...], *, trusted: tuple[str, ...] = ()
) -> list[str]:
    """``file: x._name`` for each read, on anything but ``self``, of a private member
    that another of ``files`` defines and this one does not (reads in ``trusted`` files
    are not looked at)."""
    trees = {name: ast.parse((folder / name).read_text()) for name in files}
    privates = {name: private_members(tree) for name, tree in trees.items()}
    found = []
    for name, tree in trees.items():
        if name in trusted:
            continue
        theirs = set().union(*(p for other, p in privates.items() if other != name))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in theirs - privates[name]
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                found.append(f"{name}: {ast.unparse(node)}")
    return sorted(set(found))


def test_no_module_reads_a_private_member_another_defines() -> None:
    files = tuple(str(p.relative_to(SRC)) for p in sorted(SRC.rglob("*.py")))
    assert foreign_private_reads(SRC, files, trusted=(PATCHES,)) == []


def test_the_private_member_check_sees_a_read_across_files(tmp_path: Path) -> None:
    (tmp_path / "face.py").write_text(
        "class Face:\n    def __init__(self):\n        self._route = {}\n"
        "    def _sent(self):\n        return self._route\n"
    )
    (tmp_path / "host.py").write_text(
        "class Host:\n    def run(self, face):\n        return face._route, face._sent()\n"
    )
    assert foreign_private_reads(tmp_path, ("face.py", "host.py")) == [
        "host.py: face._route",
        "host.py: face._sent",
    ]


# The Waku protocols with the node contract (waku/), which the store and the chat are
# typed with, and the in-memory node load without py-libp2p: what runs on a Waku node is
# tested without it.
MEMORY_FILES = ("memory_waku.py", "memory.py")  # in sdsync.testing
P2P_PACKAGES = ("libp2p", "trio", "multiaddr")


def p2p_imports(folder: Path, files: tuple[str, ...]) -> list[str]:
    """``file imports x`` for each import, by one of ``files``, of a p2p package or of a
    transport module outside ``files``."""
    inside = {f"sdsync.transport.{Path(name).stem}" for name in files}
    found = []
    for name in files:
        for target in imports(folder / name):
            outside = target.startswith("sdsync.transport.") and target not in inside
            if outside or target.split(".")[0] in P2P_PACKAGES:
                found.append(f"{name} imports {target}")
    return found


def test_the_waku_protocols_and_the_memory_node_need_no_p2p_stack() -> None:
    waku = SRC / "waku"
    protocols = tuple(str(path.relative_to(waku)) for path in sorted(waku.rglob("*.py")))
    assert "node.py" in protocols
    assert p2p_imports(waku, protocols) == []
    assert p2p_imports(SRC / "testing", MEMORY_FILES) == []


def test_the_p2p_import_check_sees_both_kinds(tmp_path: Path) -> None:
    (tmp_path / "node.py").write_text(
        "import trio\nfrom sdsync.transport.libp2p import X\nfrom sdsync.waku.node import Y\n"
    )
    (tmp_path / "base.py").write_text("")
    assert p2p_imports(tmp_path, ("node.py", "base.py")) == [
        "node.py imports trio",
        "node.py imports sdsync.transport.libp2p",
    ]
