"""The chat page's mends of js-waku (web/src/mends.mjs), in Node, with the sdk the page
bundles and with the sdk of the interop tests' driver (tests/interop/waku_light).

Both folders pin @waku/sdk; the page and the driver mend their ReliableChannels with the
same function, so what the interop tests exercise is what the page ships. Here each
folder's sdk gets a real ReliableChannel on a fake node (tests/web/mends_check.mjs): every
mend applies, with no warning, and does what it is for; both folders give the same
results; a version other than the one the mends were written for is reported, and a
mend whose private members are gone is skipped and says which. The last test reads the
sources: nothing else in the page or the driver touches the sdk's private members.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from testdeps import in_ci

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "web"
DRIVER = ROOT / "tests" / "interop" / "waku_light"
MENDS = WEB / "src" / "mends.mjs"
CHECK = Path(__file__).with_name("mends_check.mjs")

# Run in FOLDER, so that the bare imports resolve to its node_modules. Node 20 lacks
# Promise.withResolvers, which libp2p's dependencies call.
SCRIPT = """
Promise.withResolvers ??= function () {
  let resolve, reject;
  const promise = new this((res, rej) => ((resolve = res), (reject = rej)));
  return { promise, resolve, reject };
};
const { readFile } = await import("node:fs/promises");
const sdk = await import("@waku/sdk");
const sds = await import("@waku/sds");
const { installedVersions } = await import(%(mends)s);
const { check } = await import(%(check)s);
const modules = new URL("node_modules/", %(folder)s);
const readJson = (path) =>
  readFile(new URL(path, modules), "utf8").then(JSON.parse, () => undefined);
const outcome = await check({ sdk, sds, versions: await installedVersions(readJson) });
process.stdout.write(JSON.stringify(outcome) + "\\n");
process.exit(0);
"""


def run_check(folder: Path) -> dict[str, Any]:
    problem = None
    if shutil.which("node") is None:
        problem = "node is not installed"
    elif not (folder / "node_modules" / "@waku" / "sdk").is_dir():
        problem = f"{folder} has no node_modules: run `npm ci` there (make test does)"
    if problem:
        if in_ci():
            pytest.fail(problem)
        pytest.skip(problem)
    script = SCRIPT % {
        "mends": json.dumps(MENDS.as_uri()),
        "check": json.dumps(CHECK.as_uri()),
        "folder": json.dumps(folder.as_uri() + "/"),
    }
    result = subprocess.run(
        ["node", "--input-type=module", "-e", script],
        cwd=folder,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outcome: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return outcome


@pytest.fixture(scope="module")
def outcomes() -> dict[str, dict[str, Any]]:
    return {"page": run_check(WEB), "driver": run_check(DRIVER)}


@pytest.mark.parametrize("who", ["page", "driver"])
def test_every_mend_applies_to_the_pinned_sdk_and_does_its_job(
    outcomes: dict[str, dict[str, Any]], who: str
) -> None:
    outcome = outcomes[who]
    report = outcome["report"]
    assert report["installed"] == report["written_for"]
    assert report["applied"] == outcome["mends"]
    assert (report["skipped"], report["warnings"]) == ([], [])
    # fresh-subscription: started once, then unsubscribed and subscribed again.
    assert (outcome["started"], outcome["resubscribed"]) == (True, True)
    topic = "/sds/1/mends/proto"
    calls = [f"subscribe {topic}", f"unsubscribe {topic}", f"subscribe {topic}"]
    assert outcome["filter_calls"] == calls
    assert outcome["resends_installed"] is True
    assert outcome["hint_names_sent"] is True  # stamp-once
    assert outcome["bob_log_at_once"] == ["hi"]  # process-now
    assert outcome["hi_wrapped"] == 1  # wrap-once: sent again after it settled, not rewrapped
    assert outcome["restored"] == [True, False, False]  # restore-own: once, and only ours
    assert outcome["restored_log"] == [["alice", "hi", outcome["hi_hash"]]]
    # retrieve-in-chunks: 250 hashes in three queries to the service peer; a failure is
    # reported, not thrown.
    assert outcome["chunks"] == [{"hashes": n, "peerId": "service"} for n in (100, 100, 50)]
    assert outcome["retrieve_errors"] == ["the store is down"]


def test_the_page_and_the_driver_get_the_same_mends(outcomes: dict[str, dict[str, Any]]) -> None:
    page, driver = outcomes["page"], outcomes["driver"]
    assert page["report"]["installed"] == driver["report"]["installed"]
    # Everything but the hashes (the messages carry the time they were sent).
    for outcome in (page, driver):
        outcome.pop("hi_hash")
        for entry in outcome["restored_log"]:
            entry.pop()
    assert page == driver


def test_another_version_is_reported_and_a_missing_member_skips_its_mend(
    outcomes: dict[str, dict[str, Any]],
) -> None:
    outcome = outcomes["page"]
    other = outcome["other_versions"]
    assert other["installed"]["@waku/sdk"] == "0.0.99"
    [warning] = other["warnings"]
    assert "written for @waku/sdk 0.0.36 and @waku/sds 0.0.8" in warning
    assert "this is @waku/sdk 0.0.99" in warning
    assert other["applied"] == outcome["mends"]  # their members are all there

    lacking = outcome["lacking"]
    report = lacking["report"]
    assert report["skipped"] == [
        {"name": "restore-own", "missing": ["messageChannel.timeReceived.set"]}
    ]
    assert "restore-own" not in report["applied"]
    assert report["warnings"] == [
        "mend restore-own skipped: this ReliableChannel has no messageChannel.timeReceived.set"
    ]
    assert lacking["error"] == (
        "mend restore-own does not apply to this ReliableChannel: "
        "it has no messageChannel.timeReceived.set"
    )


# Members of ReliableChannel and MessageChannel that their public API does not offer.
PRIVATE = re.compile(
    r"_pushOutgoingMessage|\bretryManager\b|\bmissingMessageRetriever\b|\blocalHistory\b"
    r"|\bprocessIncomingMessages?\b|\bdeliverMessage\b|\btimeReceived\b|\boutgoingBuffer\b"
    r"|\bsweepIncomingBuffer\b|\bprocessTasks\b|channel\.decoder\b|channel\.subscribe\("
)


def test_only_the_mends_module_touches_the_sdks_private_members() -> None:
    sources = [*sorted((WEB / "src").glob("*.mjs")), DRIVER / "light.mjs"]
    touching = {
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sources
        if path != MENDS
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE.search(line)
    }
    assert touching == set()
    # ...and both mend their channels with its one function.
    import_line = re.compile(r'import \{[^}]*\bmendReliableChannel\b[^}]*\} from "([^"]+)"')
    for path in (WEB / "src" / "chat.mjs", DRIVER / "light.mjs"):
        source = path.read_text()
        [imported] = import_line.findall(source)
        assert (path.parent / imported).resolve() == MENDS, path
        assert "mendReliableChannel(" in source, path  # called, not only imported
