"""A service node's libp2p identity, kept across restarts: its *node key*.

Theory of operation
-------------------
Pages, terminal chats, light clients and other store nodes dial a service node by a
multiaddr ending in ``/p2p/<peer id>``, and the peer id is the hash of the node's public
key.  A node that made a new key at every start would strand every client holding its
old address, so a store node keeps one.  Its key is, in order of precedence:

1. ``--nodekey HEX`` (or ``SDSYNC_NODEKEY``): 64 hex characters, as nwaku's ``--nodekey``;
2. ``--nodekey-file PATH``: a file holding the same 64 hex characters;
3. ``DATA_DIR/nodekey``, read if it exists, else created at first start.

The key is a secp256k1 private key, as nwaku's is, so a hex key moved between an nwaku
node and ours keeps its peer id (``tests/interop`` checks this against nwaku).  A file we
create is written owner-only (mode 0600), whole or not at all (:mod:`sdsync.files`), and
hard-linked into place, which fails if the name exists — so two nodes started on the same
data dir at once cannot each keep a different key: the second reads the first's.
A key file readable by others still works (an operator may have reasons) but is reported
in :attr:`NodeKeySource.warning`.

Rotating the key is deleting or replacing the file (or changing the flag) and restarting:
the node then has a new peer id, which every client must be told (docs/store.md).
"""

from __future__ import annotations

import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sdsync.errors import OptionError
from sdsync.files import write_whole

if TYPE_CHECKING:
    from libp2p.crypto.keys import KeyPair

NODEKEY_FILE = "nodekey"
SECRET_BYTES = 32
# The order of secp256k1's group: a private key is an integer in [1, ORDER).
_ORDER = 0xFFFFFFFF_FFFFFFFF_FFFFFFFF_FFFFFFFE_BAAEDCE6_AF48A03B_BFD25E8C_D0364141

__all__ = ["NODEKEY_FILE", "NodeKey", "NodeKeySource", "choose_nodekey"]


@dataclass(frozen=True, slots=True)
class NodeKey:
    """A secp256k1 private key: the identity of a libp2p node."""

    secret: bytes

    def __post_init__(self) -> None:
        if len(self.secret) != SECRET_BYTES:
            raise ValueError(f"a node key is {SECRET_BYTES} bytes, not {len(self.secret)}")
        if not 0 < int.from_bytes(self.secret, "big") < _ORDER:
            raise ValueError("not a secp256k1 private key (zero, or not below the group order)")

    @classmethod
    def generate(cls) -> NodeKey:
        while True:  # a 256-bit draw is at or above the order with probability ~2^-128
            secret = secrets.token_bytes(SECRET_BYTES)
            if 0 < int.from_bytes(secret, "big") < _ORDER:
                return cls(secret)

    @classmethod
    def from_hex(cls, text: str) -> NodeKey:
        """``text``: 64 hex characters (an ``0x`` prefix and surrounding whitespace are
        allowed); raises ``ValueError`` saying what is wrong, never showing the key."""
        digits = text.strip().removeprefix("0x")
        if len(digits) != 2 * SECRET_BYTES:
            raise ValueError(f"expected {2 * SECRET_BYTES} hex characters, got {len(digits)}")
        try:
            secret = bytes.fromhex(digits)
        except ValueError:
            raise ValueError("not hexadecimal") from None
        return cls(secret)

    def hex(self) -> str:
        return self.secret.hex()

    def key_pair(self) -> KeyPair:
        from libp2p.crypto.secp256k1 import create_new_key_pair

        return create_new_key_pair(self.secret)

    @property
    def peer_id(self) -> str:
        from libp2p.peer.id import ID

        return str(ID.from_pubkey(self.key_pair().public_key).to_base58())

    def __repr__(self) -> str:  # a key printed by accident must not leak
        return "NodeKey(<secret>)"


@dataclass(frozen=True, slots=True)
class NodeKeySource:
    """Which key a node runs with, and where it came from (for its start line)."""

    key: NodeKey
    origin: str
    """``--nodekey``, ``--nodekey-file PATH``, ``PATH (kept)`` or ``PATH (created)``."""
    warning: str | None = None


def choose_nodekey(
    data_dir: Path, *, hex_key: str | None = None, key_file: Path | None = None
) -> NodeKeySource:
    """The node key by the precedence above (``hex_key``, ``key_file``, then
    ``data_dir``); raises :class:`~sdsync.errors.OptionError` naming which of the three
    holds a key that cannot be used."""
    if hex_key is not None and key_file is not None:
        raise OptionError("nodekey", "give a node key or a node key file, not both")
    if hex_key is not None:
        return NodeKeySource(_parse(hex_key, "nodekey", "the key"), "--nodekey")
    if key_file is not None:
        return _read(key_file, "nodekey_file", f"--nodekey-file {key_file}")
    path = data_dir / NODEKEY_FILE
    try:
        return NodeKeySource(_create(path), f"{path} (created)")
    except FileExistsError:
        source = _read(path, "data_dir", str(path))
        return NodeKeySource(source.key, f"{path} (kept)", source.warning)


def _parse(text: str, option: str, where: str) -> NodeKey:
    try:
        return NodeKey.from_hex(text)
    except ValueError as exc:
        raise OptionError(option, f"{where} is not a node key: {exc}") from None


def _read(path: Path, option: str, origin: str) -> NodeKeySource:
    try:
        text = path.read_text(encoding="ascii")
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(option, f"cannot read the node key {path}: {exc}") from None
    warning = None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        warning = f"{path} is readable by others (mode {stat.filemode(mode)}): chmod 600 it"
    return NodeKeySource(_parse(text, option, str(path)), origin, warning)


def _create(path: Path) -> NodeKey:
    """A new key written to ``path``; ``FileExistsError`` if one is there already."""
    if path.exists():
        raise FileExistsError(path)
    key = NodeKey.generate()
    write_whole(path, key.hex() + "\n", replace=False)  # fails if another start made one
    return key
