r"""Every shell and Python example in README.md and docs/*.md, run as written (issue 39).

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
``<!-- docs-test: with PLACEHOLDER = NAME -->``
    the block is run with each PLACEHOLDER in its text (e.g. the ``/ip4/…/p2p/…`` the doc
    shows) replaced by the value captured as NAME, as its reader pastes the address
    another process printed. A named group of a ``serve``, ``expect`` or ``wait`` regex
    captures a value: ``serve listening on (?P<A>/ip4/\S+)``. A PLACEHOLDER not in the
    block, or a NAME nothing captured, fails the example.
``<!-- docs-test: terminal N wait REGEX | terminal N type LINE | terminal N serve REGEX -->``
    the block is a scene in several terminals: each command in it (a line and its ``\``
    continuations; comments aside) runs as its own process, terminal 1, 2, … in order,
    and these steps are taken in the order given. ``wait``: until terminal N's output
    matches REGEX (a value it captures can then be pasted into a later terminal);
    ``type``: LINE and Enter on its input. A terminal starts when a step first names it
    or a later one (so terminal 2 starts after the steps before, with what they
    captured), the rest after the last step. Then each terminal's input ends (Ctrl-D:
    an interactive chat quits) and each must end by itself, as ``exit`` says (0 by
    default), without a traceback; a terminal named by ``serve`` (a ``wait`` for a
    server, which Ctrl-D does not end) is stopped with Ctrl-C once the others ended.
    ``expect`` applies to the terminals' outputs, one after the other.

Directives but ``skip`` combine with ``;``: ``<!-- docs-test: exit 1; expect not converged -->``,
and a marker may span several lines. A block takes at most :data:`BLOCK_TIMEOUT_S` (a
liveness bound); a wait for output, at most :data:`OUTPUT_TIMEOUT_S`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = (".venv", "scenarios", "bench", "examples")
BLOCK_TIMEOUT_S = 300.0
OUTPUT_TIMEOUT_S = 120.0

SECTION = re.compile(r"^## ", re.M)
FENCE = re.compile(
    r"^(?P<indent> {0,3})(?:<!-- docs-test: (?P<marker>(?:(?!-->).)*?) -->\n(?P=indent))?"
    r"```(?P<lang>sh|python)\n(?P<body>.*?)^(?P=indent)```$",
    re.S | re.M,
)
STEP = re.compile(r"(?P<terminal>\d+) (?P<verb>wait|type|serve) (?P<arg>.*)")


@dataclass(frozen=True)
class Step:
    """``terminal N VERB ARG``: what is done in terminal N, in the order given."""

    terminal: int
    verb: str
    arg: str


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
    paste: tuple[tuple[str, str], ...] = ()  # (placeholder, name) of each "with"
    steps: tuple[Step, ...] = ()

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
        marker = re.sub(r"\s*\n\s*", " ", match["marker"] or "")
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
            elif name == "with" and " = " in value:
                placeholder, _, captured = value.rpartition(" = ")
                options["paste"] = (*options.get("paste", ()), (placeholder, captured))  # type: ignore[misc]
            elif name == "terminal" and (step := STEP.fullmatch(value)):
                new = Step(int(step["terminal"]), step["verb"], step["arg"])
                options["steps"] = (*options.get("steps", ()), new)  # type: ignore[misc]
            else:
                raise ValueError(f"{document.name}:{line}: bad docs-test directive {directive!r}")
        body = textwrap.dedent(match["body"]) if match["indent"] else match["body"]
        found.append(Example(document, line, match["lang"], body, **options))  # type: ignore[arg-type]
    return found


def commands(body: str) -> list[str]:
    """The commands of a shell block, each a line with its ``\\`` continuations."""
    found: list[str] = []
    continued = False
    for line in body.splitlines():
        if continued:
            found[-1] += "\n" + line
        elif line.strip() and not line.lstrip().startswith("#"):
            found.append(line)
        else:
            continue
        continued = line.endswith("\\")
    return found


@dataclass
class Terminal:
    """One command of a block run as its own process, its input a pipe, as typed."""

    where: str
    process: subprocess.Popen[str]
    log: Path
    server: bool = False


@dataclass
class Playground:
    """The directory a document's examples run in, the servers they left running, and the
    values captured from their output."""

    root: Path
    env: dict[str, str]
    servers: list[tuple[Example, subprocess.Popen[str], Path]] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)

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

    def pasted(self, example: Example, text: str) -> str:
        """``text`` with each placeholder it holds replaced by its captured value."""
        for placeholder, name in example.paste:
            if placeholder in text:
                assert name in self.values, (
                    f"{example.where}: with {placeholder} = {name}: nothing captured as "
                    f"{name!r} before (captured: {', '.join(sorted(self.values)) or 'nothing'})"
                )
                text = text.replace(placeholder, self.values[name])
        return text

    def capture(self, pattern: str, output: str) -> bool:
        """Whether ``output`` matches; its named groups are kept as values to paste."""
        match = re.search(pattern, output)
        if match is not None:
            self.values.update({k: v for k, v in match.groupdict().items() if v is not None})
        return match is not None

    def wait_for(self, where: str, process: subprocess.Popen[str], log: Path, pattern: str) -> str:
        """The output of ``process`` once it matches ``pattern`` (which captures)."""
        deadline = time.monotonic() + OUTPUT_TIMEOUT_S
        while True:
            ended = process.poll() is not None
            if self.capture(pattern, output := log.read_text()):
                return output
            assert not ended, (
                f"{where} ended (exit {process.returncode}) before its output matched "
                f"{pattern!r}:\n{output[-3000:]}"
            )
            assert time.monotonic() < deadline, (
                f"{where}: no {pattern!r} in its output after {OUTPUT_TIMEOUT_S:g} s:\n"
                f"{output[-3000:]}"
            )
            time.sleep(0.2)

    def run(self, example: Example) -> str:
        for placeholder, _ in example.paste:
            assert placeholder in example.body, (
                f"{example.where}: with {placeholder} = …: no {placeholder!r} in the block"
            )
        if example.setup is not None:
            self.run(Example(example.document, example.line, "sh", example.setup))
        if example.steps:
            return self.act(example)
        example = dataclasses.replace(example, body=self.pasted(example, example.body))
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
        for pattern in example.expect:
            self.capture(pattern, output)
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
        return self.wait_for(f"{example.where} (serve)", process, log, example.serve)

    def act(self, example: Example) -> str:
        """The block's commands, each in its own terminal, and its steps in them."""
        assert example.lang == "sh", f"{example.where}: terminals run shell commands"
        lines = commands(example.body)
        for step in example.steps:
            assert 1 <= step.terminal <= len(lines), (
                f"{example.where}: no terminal {step.terminal}: the block has {len(lines)} commands"
            )
        terminals: list[Terminal] = []

        def open_up_to(n: int) -> None:
            while len(terminals) < n:
                number = len(terminals) + 1
                command = self.pasted(example, lines[number - 1])
                log = self.root / f"terminal-{example.line}-{number}.log"
                with log.open("w") as sink:
                    process = subprocess.Popen(
                        ["bash", "-e", "-c", command],
                        cwd=self.root,
                        env=self.env,
                        stdin=subprocess.PIPE,
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                        text=True,
                        start_new_session=True,
                    )
                terminals.append(Terminal(f"{example.where} terminal {number}", process, log))

        try:
            try:
                self.take(example.steps, terminals, open_up_to)
            except AssertionError as error:  # what the other terminals showed, too
                shown = "".join(
                    f"\n{t.where}:\n{t.log.read_text()[-1500:]}"
                    for t in terminals
                    if t.where not in str(error)
                )
                raise AssertionError(f"{error}{shown}") from None
            open_up_to(len(lines))
            for terminal in terminals:  # Ctrl-D
                assert terminal.process.stdin is not None
                terminal.process.stdin.close()
            deadline = time.monotonic() + BLOCK_TIMEOUT_S
            problems = [
                self.end(terminal, example.exit_code, deadline - time.monotonic())
                for terminal in terminals
                if not terminal.server
            ]
            for terminal in reversed(terminals):  # as stop() does: the last started first
                if terminal.server:
                    if terminal.process.poll() is None:
                        os.killpg(terminal.process.pid, signal.SIGINT)  # Ctrl-C
                    problems.append(self.end(terminal, None, 30))
            assert not any(problems), "\n".join(filter(None, problems))
        finally:
            for terminal in terminals:
                if terminal.process.poll() is None:
                    os.killpg(terminal.process.pid, signal.SIGKILL)
                    terminal.process.wait()
        return "".join(f"{t.where}:\n{t.log.read_text()}" for t in terminals)

    def take(
        self, steps: tuple[Step, ...], terminals: list[Terminal], open_up_to: Callable[[int], None]
    ) -> None:
        for step in steps:
            open_up_to(step.terminal)
            terminal = terminals[step.terminal - 1]
            if step.verb == "type":
                assert terminal.process.poll() is None, (
                    f"{terminal.where} ended before {step.arg!r} was typed:\n"
                    f"{terminal.log.read_text()[-3000:]}"
                )
                assert terminal.process.stdin is not None
                terminal.process.stdin.write(step.arg + "\n")
                terminal.process.stdin.flush()
                continue
            terminal.server = terminal.server or step.verb == "serve"
            self.wait_for(terminal.where, terminal.process, terminal.log, step.arg)

    @staticmethod
    def end(terminal: Terminal, exit_code: int | None, timeout: float) -> str:
        """What is wrong, if anything, with how a terminal ended: by itself within
        ``timeout`` s, with ``exit_code`` (None: any), and without a traceback."""
        try:
            code: int | None = terminal.process.wait(timeout=max(timeout, 0))
        except subprocess.TimeoutExpired:
            code = None
        output = terminal.log.read_text()
        if code is None:
            problem = f"still running after {timeout:.0f} s"
        elif exit_code is not None and code != exit_code:
            problem = f"exited {code}, not {exit_code}"
        elif "Traceback" in output:
            problem = "printed a traceback"
        else:
            return ""
        return f"{terminal.where} {problem}:\n{output[-3000:]}"

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


def written(tmp_path: Path, text: str) -> list[Example]:
    """The examples of a document ``doc.md`` holding ``text`` (the runner's own tests)."""
    document = tmp_path / "doc.md"
    document.write_text(text)
    return examples(document)


def test_the_runner_fails_a_failing_example(tmp_path: Path) -> None:
    """A doc example that fails is a failing test: a wrong exit, a missing output."""
    first, second, third = written(
        tmp_path,
        "<!-- docs-test: expect ^hello -->\n```sh\necho hello\n```\n"
        "<!-- docs-test: exit 3 -->\n```sh\nexit 3\n```\n"
        "```python\nimport sys\nawait __import__('asyncio').sleep(0)\nsys.exit(2)\n```\n",
    )
    playground = Playground.make(tmp_path / "p")
    assert re.search(first.expect[0], playground.run(first))
    playground.run(second)
    with pytest.raises(AssertionError, match="exited 2, not 0"):
        playground.run(third)


def test_a_value_printed_by_one_block_is_pasted_into_another(tmp_path: Path) -> None:
    """A named group of a serve regex captures; ``with`` pastes it over a placeholder."""
    serve, paste = written(
        tmp_path,
        "<!-- docs-test: serve ready on (?P<PORT>\\d+) -->\n"
        "```sh\necho ready on 4242; sleep 60\n```\n"
        "<!-- docs-test: with 1234 = PORT;\n     expect ^:4242$ -->\n```sh\necho :1234\n```\n",
    )
    assert paste.paste == (("1234", "PORT"),) and paste.expect == ("^:4242$",)
    playground = Playground.make(tmp_path / "p")
    try:
        playground.run(serve)
        assert re.search(paste.expect[0], playground.run(paste))
    finally:
        playground.stop()


def test_a_capture_that_never_comes_fails_naming_its_regex(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ends, hangs = written(
        tmp_path,
        "<!-- docs-test: serve listening on (?P<A>/ip4/\\S+) -->\n```sh\necho starting\n```\n"
        "<!-- docs-test: serve listening on (?P<A>/ip4/\\S+) -->\n```sh\nsleep 60\n```\n",
    )
    playground = Playground.make(tmp_path / "p")
    monkeypatch.setattr(sys.modules[__name__], "OUTPUT_TIMEOUT_S", 1.0)
    try:
        with pytest.raises(AssertionError, match=r"ended \(exit 0\) before its output matched "):
            playground.run(ends)
        with pytest.raises(AssertionError, match=r"no 'listening on \(\?P<A>/ip4/\\\\S\+\)' in"):
            playground.run(hangs)
    finally:
        playground.stop()


def test_a_placeholder_not_in_the_block_or_a_value_not_captured_fails(tmp_path: Path) -> None:
    elsewhere, uncaptured = written(
        tmp_path,
        "<!-- docs-test: with /ip4/…/p2p/… = A -->\n```sh\necho /ip4/1.2.3.4/p2p/x\n```\n"
        "<!-- docs-test: with /ip4/…/p2p/… = A -->\n```sh\necho /ip4/…/p2p/…\n```\n",
    )
    playground = Playground.make(tmp_path / "p")
    with pytest.raises(AssertionError, match="no '/ip4/…/p2p/…' in the block"):
        playground.run(elsewhere)
    with pytest.raises(AssertionError, match="nothing captured as 'A' before"):
        playground.run(uncaptured)


SCENE = """\
<!-- docs-test: with INBOX = A; terminal 1 wait listening on (?P<A>\\S+); terminal 2 type hello;
     terminal 1 wait got hello{more} -->
```sh
# terminal 1: reads its inbox, then stays until Ctrl-D
echo "listening on inbox-$$"; until [ -s inbox-$$ ]; do sleep 0.1; done; \\
    echo "got $(cat inbox-$$)"; cat
# terminal 2, given terminal 1's address
read line; echo "$line" > INBOX; cat{last}
```
"""


def test_terminals_run_each_command_with_what_is_typed_and_end_on_ctrl_d(tmp_path: Path) -> None:
    """Each command a process: terminal 2 starts with what terminal 1 printed pasted in,
    a line is typed into it, and both end at end of input."""
    (scene,) = written(tmp_path, SCENE.format(more="; expect got hello", last=""))
    assert [step.verb for step in scene.steps] == ["wait", "type", "wait"]
    assert len(commands(scene.body)) == 2
    output = Playground.make(tmp_path / "p").run(scene)
    assert re.search(r"doc.md:\d+ terminal 1:\nlistening on inbox-\d+\ngot hello\n", output)


def test_a_failing_terminal_fails_the_example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong exit, a wait that never matches, a server: each is checked."""
    exits_3, never, server = written(
        tmp_path,
        SCENE.format(more="", last="; exit 3")
        + SCENE.format(more="; terminal 2 wait never", last="")
        + "<!-- docs-test: terminal 1 serve up; terminal 2 wait done -->\n"
        "```sh\necho up; sleep 60\necho done\n```\n",
    )
    playground = Playground.make(tmp_path / "p")
    with pytest.raises(AssertionError, match=r"terminal 2 exited 3, not 0"):
        playground.run(exits_3)
    monkeypatch.setattr(sys.modules[__name__], "OUTPUT_TIMEOUT_S", 1.0)
    # What the other terminals showed comes with it.
    with pytest.raises(AssertionError, match=r"(?s)terminal 2: no 'never'.*terminal 1:\nlist"):
        playground.run(never)
    start = time.monotonic()
    playground.run(server)  # stopped by Ctrl-C once the others ended
    assert time.monotonic() - start < 30
