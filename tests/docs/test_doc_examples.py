"""Every shell and Python example in README.md and docs/*.md, run as written (issue 39).

An example is a fenced block tagged ``sh`` or ``python``. The blocks of one document run
in order, in one temporary directory that plays the project's root (``.venv``,
``scenarios``, ``bench`` and ``examples`` linked in, ``../shared`` beside it), with
``HOME`` there too, so that ``~/.sdsync`` and ``out/`` are fresh, and with
``.venv/bin`` first on ``PATH``, as after ``. .venv/bin/activate`` (the README says so
before the first bare ``sdsync``). A shell block runs in ``bash -e``; a Python block in
the project's Python, its top-level ``await`` run by asyncio.

An HTML comment on the line before a block, invisible on GitHub, tells the runner more:

``<!-- docs-test: skip REASON -->``
    the block is not run, and REASON says why (listed by :func:`test_every_skip_says_why`).
``<!-- docs-test: exit N -->``
    the block must exit N (default 0).
``<!-- docs-test: expect REGEX -->``
    its output (stdout and stderr) must match REGEX.
``<!-- docs-test: setup COMMAND -->``
    COMMAND runs first, in the shell: what the text before the block says must have
    happened (e.g. ``make demo``'s output), done here by the command that does it.
``<!-- docs-test: serve REGEX -->``
    the block starts a server that runs until stopped: it runs in the background until
    its output matches REGEX, the blocks after it run, and it is stopped (SIGINT, as
    Ctrl-C) at the end of its section (the next ``##`` heading), where it must end by
    itself without a traceback.

Directives but ``skip`` combine with ``;``: ``<!-- docs-test: exit 1; expect not converged -->``.
A block takes at most :data:`BLOCK_TIMEOUT_S` (a liveness bound).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = (".venv", "scenarios", "bench", "examples")
BLOCK_TIMEOUT_S = 300.0
SERVE_TIMEOUT_S = 60.0

SECTION = re.compile(r"^## ", re.M)
FENCE = re.compile(
    r"^(?P<indent> {0,3})(?:<!-- docs-test: (?P<marker>[^\n]*?) -->\n(?P=indent))?"
    r"```(?P<lang>sh|python)\n(?P<body>.*?)^(?P=indent)```$",
    re.S | re.M,
)


@dataclass(frozen=True)
class Example:
    document: Path
    line: int
    lang: str
    body: str
    skip: str | None = None
    exit_code: int = 0
    expect: tuple[str, ...] = ()
    serve: str | None = None
    setup: str | None = None
    section: int = 0

    @property
    def where(self) -> str:
        name = (
            self.document.relative_to(ROOT) if self.document.is_relative_to(ROOT) else self.document
        )
        return f"{name}:{self.line}"


def examples(document: Path) -> list[Example]:
    text = document.read_text()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start("lang")) + 1
        options: dict[str, object] = {"section": len(SECTION.findall(text, 0, match.start()))}
        marker = match["marker"] or ""
        # A reason may hold any text; other directives combine with ";".
        directives = [marker] if marker.startswith("skip ") else marker.split(";")
        for directive in filter(None, (d.strip() for d in directives)):
            name, _, value = directive.partition(" ")
            if name == "skip":
                options["skip"] = value
            elif name == "exit":
                options["exit_code"] = int(value)
            elif name == "expect":
                options["expect"] = (*options.get("expect", ()), value)  # type: ignore[misc]
            elif name == "serve":
                options["serve"] = value
            elif name == "setup":
                options["setup"] = value
            else:
                raise ValueError(f"{document.name}:{line}: unknown docs-test directive {name!r}")
        body = textwrap.dedent(match["body"]) if match["indent"] else match["body"]
        found.append(Example(document, line, match["lang"], body, **options))  # type: ignore[arg-type]
    return found


@dataclass
class Playground:
    """The directory a document's examples run in, and the servers they left running."""

    root: Path
    env: dict[str, str]
    servers: list[tuple[Example, subprocess.Popen[str], Path]] = field(default_factory=list)

    @classmethod
    def make(cls, base: Path) -> Playground:
        base.mkdir(exist_ok=True)
        (base / "shared").symlink_to(ROOT.parent / "shared")
        root = base / "main"
        root.mkdir()
        for name in LINKED:
            (root / name).symlink_to(ROOT / name)
        env = {
            **os.environ,
            "HOME": str(root),
            "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "COLUMNS": "80",
            "NO_COLOR": "1",
        }
        return cls(root, env)

    def command(self, example: Example) -> list[str]:
        if example.lang == "sh":
            return ["bash", "-e", "-c", example.body]
        # Top-level await, as in the docs' sketches of async code.
        wrapped = "import asyncio\n\nasync def _example():\n" + textwrap.indent(
            example.body + "\npass\n", "    "
        )
        return [sys.executable, "-c", wrapped + "\nasyncio.run(_example())\n"]

    def run(self, example: Example) -> str:
        if example.setup is not None:
            self.run(Example(example.document, example.line, "sh", example.setup))
        if example.serve is not None:
            return self.start(example)
        process = subprocess.Popen(
            self.command(example),
            cwd=self.root,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # so that a timeout ends what the block started too
        )
        try:
            output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            raise AssertionError(
                f"{example.where} still running after {BLOCK_TIMEOUT_S} s:\n{output[-3000:]}"
            ) from None
        code = process.returncode
        assert code == example.exit_code, (
            f"{example.where} exited {code}, not {example.exit_code}:\n{output[-3000:]}"
        )
        return output

    def start(self, example: Example) -> str:
        assert example.serve is not None
        log = self.root / f"serve-{example.line}.log"
        with log.open("w") as sink:
            process = subprocess.Popen(
                self.command(example),
                cwd=self.root,
                env=self.env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        self.servers.append((example, process, log))
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while not re.search(example.serve, output := log.read_text()):
            assert process.poll() is None, (
                f"{example.where} ended before serving:\n{output[-3000:]}"
            )
            assert time.monotonic() < deadline, f"{example.where} not serving:\n{output[-3000:]}"
            time.sleep(0.2)
        return output

    def stop(self) -> None:
        """Ctrl-C to each server, as its user would; each must then end by itself."""
        problems = []
        for example, process, log in reversed(self.servers):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    problems.append(f"{example.where} did not stop on Ctrl-C")
            if "Traceback" in (text := log.read_text()):
                problems.append(f"{example.where} printed a traceback:\n{text[-3000:]}")
        self.servers.clear()
        assert not problems, "\n".join(problems)


def documents() -> list[object]:
    return [
        pytest.param(document, id=str(document.relative_to(ROOT)))
        for document in DOCUMENTS
        if any(example.skip is None for example in examples(document))
    ]


# Fixed ports (8645, 8646, 60000…) as the docs give them, and minutes of Spark: a group
# of its own, beside the other groups rather than after them.
@pytest.mark.xdist_group("docs")
@pytest.mark.parametrize("document", documents())
def test_every_example_runs_as_written(document: Path, tmp_path: Path) -> None:
    playground = Playground.make(tmp_path)
    section = 0
    try:
        for example in examples(document):
            if example.skip is not None:
                continue
            if example.section != section:
                playground.stop()
                section = example.section
            output = playground.run(example)
            for pattern in example.expect:
                assert re.search(pattern, output), (
                    f"{example.where}: no {pattern!r} in its output:\n{output[-3000:]}"
                )
    finally:
        playground.stop()


def test_every_skip_says_why() -> None:
    """A skipped example names its reason, and the tally is printed (``pytest -s``)."""
    run = skipped = 0
    for document in DOCUMENTS:
        for example in examples(document):
            if example.skip is None:
                run += 1
                continue
            skipped += 1
            assert len(example.skip.split()) >= 3, f"{example.where}: skip without a reason"
            print(f"skipped {example.where}: {example.skip}")
    print(f"{run} examples run, {skipped} skipped")


UNTAGGED = re.compile(r"^```\n(?P<first>[^\n]*)", re.M)
COMMAND = re.compile(r"^(\$ |sdsync |\.venv/|make |curl |python|pip )")
# Shown, not run: a synopsis ("[--flag ...]"), a transcript ("$ command" and its output).
SHOWN = re.compile(r" \[--|^\$ ")


def test_every_command_is_in_a_tagged_block() -> None:
    """A block of commands without ``sh`` would escape the runner: none may start so."""
    untagged = [
        f"{document.relative_to(ROOT)}: {match['first']}"
        for document in DOCUMENTS
        for match in UNTAGGED.finditer(document.read_text())
        if COMMAND.match(match["first"]) and not SHOWN.search(match["first"])
    ]
    assert not untagged, untagged


def test_the_runner_fails_a_failing_example(tmp_path: Path) -> None:
    """A doc example that fails is a failing test: a wrong exit, a missing output."""
    document = tmp_path / "doc.md"
    document.write_text(
        "<!-- docs-test: expect ^hello -->\n```sh\necho hello\n```\n"
        "<!-- docs-test: exit 3 -->\n```sh\nexit 3\n```\n"
        "```python\nimport sys\nawait __import__('asyncio').sleep(0)\nsys.exit(2)\n```\n"
    )
    first, second, third = examples(document)
    playground = Playground.make(tmp_path / "p")
    assert re.search(first.expect[0], playground.run(first))
    playground.run(second)
    with pytest.raises(AssertionError, match="exited 2, not 0"):
        playground.run(third)
