"""A service node's kept identity (transport/nodekey.py): which key wins, the file written
owner-only and whole, a race of two first starts, a crash midway, and bad keys refused
with the option named and the key never shown."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from sdsync import files
from sdsync.errors import OptionError
from sdsync.transport.nodekey import NODEKEY_FILE, NodeKey, choose_nodekey

# The largest valid secp256k1 key, and the smallest: the order minus one, and one.
LARGEST = "fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364140"
SMALLEST = "00" * 31 + "01"


def test_a_key_is_created_once_owner_only_and_kept(tmp_path: Path) -> None:
    first = choose_nodekey(tmp_path / "data")
    path = tmp_path / "data" / NODEKEY_FILE
    assert first.origin == f"{path} (created)" and first.warning is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == first.key.hex() + "\n"
    again = choose_nodekey(tmp_path / "data")
    assert again.key == first.key and again.origin == f"{path} (kept)"
    assert again.key.peer_id == first.key.peer_id
    assert [p.name for p in path.parent.iterdir()] == [NODEKEY_FILE]  # no temporary left


def test_a_flag_wins_over_the_file_and_the_data_dir(tmp_path: Path) -> None:
    kept = choose_nodekey(tmp_path).key
    key_file = tmp_path / "other.key"
    key_file.write_text("0x" + SMALLEST + "\n")
    os.chmod(key_file, 0o600)
    from_file = choose_nodekey(tmp_path, key_file=key_file)
    assert from_file.key.hex() == SMALLEST and from_file.origin == f"--nodekey-file {key_file}"
    from_flag = choose_nodekey(tmp_path, hex_key=LARGEST.upper())
    assert from_flag.key.hex() == LARGEST and from_flag.origin == "--nodekey"
    assert choose_nodekey(tmp_path).key == kept  # the data dir's key is untouched


def test_the_same_hex_gives_the_same_peer_id_and_different_keys_differ() -> None:
    assert NodeKey.from_hex(SMALLEST).peer_id == NodeKey.from_hex(SMALLEST).peer_id
    assert NodeKey.from_hex(SMALLEST).peer_id != NodeKey.from_hex(LARGEST).peer_id
    assert NodeKey.from_hex(SMALLEST).peer_id.startswith("16Uiu2")  # secp256k1, as nwaku's


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "expected 64 hex characters, got 0"),
        ("ab" * 31, "expected 64 hex characters, got 62"),
        ("ab" * 33, "expected 64 hex characters, got 66"),
        ("zz" * 32, "not hexadecimal"),
        ("00" * 32, "not a secp256k1 private key"),
        ("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141", "not a secp256k1"),
        ("ff" * 32, "not a secp256k1 private key"),
    ],
)
def test_a_bad_key_names_its_option_and_never_shows_itself(
    tmp_path: Path, text: str, why: str
) -> None:
    with pytest.raises(OptionError) as flag:
        choose_nodekey(tmp_path, hex_key=text)
    assert flag.value.option == "nodekey" and why in str(flag.value)
    key_file = tmp_path / "bad.key"
    key_file.write_text(text)
    with pytest.raises(OptionError) as in_file:
        choose_nodekey(tmp_path, key_file=key_file)
    assert in_file.value.option == "nodekey_file" and str(key_file) in str(in_file.value)
    (tmp_path / NODEKEY_FILE).write_text(text)
    with pytest.raises(OptionError) as in_data_dir:
        choose_nodekey(tmp_path)
    assert in_data_dir.value.option == "data_dir"
    for error in (flag.value, in_file.value, in_data_dir.value):
        assert not text or text not in str(error)


def test_both_flags_at_once_are_refused(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="not both"):
        choose_nodekey(tmp_path, hex_key=SMALLEST, key_file=tmp_path / "k")
    assert not (tmp_path / NODEKEY_FILE).exists()


def test_an_unreadable_key_file_is_an_option_error(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="cannot read the node key") as missing:
        choose_nodekey(tmp_path, key_file=tmp_path / "absent")
    assert missing.value.option == "nodekey_file"
    binary = tmp_path / "binary.key"
    binary.write_bytes(b"\xff\xfe" * 32)
    with pytest.raises(OptionError, match="cannot read the node key"):
        choose_nodekey(tmp_path, key_file=binary)


def test_a_key_file_others_can_read_works_with_a_warning(tmp_path: Path) -> None:
    choose_nodekey(tmp_path)
    os.chmod(tmp_path / NODEKEY_FILE, 0o644)
    source = choose_nodekey(tmp_path)
    assert source.warning is not None and "chmod 600" in source.warning


def test_two_first_starts_at_once_keep_one_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both find no key and make one; the second to link its file into place reads the
    first's."""
    barrier = threading.Barrier(2)
    generate = NodeKey.generate

    def slow_generate() -> NodeKey:
        key = generate()
        barrier.wait(timeout=10)  # both have found no file and made a key
        return key

    monkeypatch.setattr(NodeKey, "generate", staticmethod(slow_generate))
    results: list[NodeKey] = []
    threads = [
        threading.Thread(target=lambda: results.append(choose_nodekey(tmp_path).key))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(results) == 2 and results[0] == results[1]
    assert (tmp_path / NODEKEY_FILE).read_text() == results[0].hex() + "\n"
    assert [p.name for p in tmp_path.iterdir()] == [NODEKEY_FILE]


@pytest.mark.parametrize("step", ["write", "fsync", "link"])
def test_a_crash_while_creating_leaves_no_key_and_the_next_start_makes_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """A failure at each step before the key is in place leaves no ``nodekey`` (never a
    partial one) and no temporary file; the next start creates the key."""

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError(f"crash at {step}")

    target = {"write": "fdopen", "fsync": "fsync", "link": "link"}[step]
    with monkeypatch.context() as patch:
        patch.setattr(files.os, target, crash)
        with pytest.raises(OSError, match=f"crash at {step}"):
            choose_nodekey(tmp_path)
    assert list(tmp_path.iterdir()) == []
    created = choose_nodekey(tmp_path)
    assert created.origin.endswith("(created)")


def test_a_key_is_never_shown_by_repr() -> None:
    assert SMALLEST not in repr(NodeKey.from_hex(SMALLEST))
