"""Who a chat participant is, kept in its state directory as ``chat.json``.

The file holds the participant id, the libp2p private key and the address we last
listened on — reused so that the ``--peer`` addresses others were given stay valid. It
holds a private key: it is written owner-only, whole or not at all.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from sdsync.errors import LocalProtocolError, OptionError
from sdsync.files import write_whole

CHAT_FILE = "chat.json"


@dataclass(frozen=True, slots=True)
class Identity:
    participant_id: str
    key: bytes
    listen: str | None = None


def load_identity(state_dir: Path | None, name: str | None) -> Identity:
    """Who we are: from the state directory, else new (and then stored there)."""
    from sdsync.transport.libp2p import new_identity_key

    path = state_dir / CHAT_FILE if state_dir is not None else None
    if path is None or not path.exists():
        identity = Identity(name or f"user-{secrets.token_hex(4)}", new_identity_key())
        if state_dir is not None:
            save_identity(state_dir, identity)
        return identity
    try:
        stored = json.loads(path.read_text())
        identity = Identity(
            stored["participant_id"], bytes.fromhex(stored["key_hex"]), stored.get("listen")
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LocalProtocolError(f"{path} is not a chat identity file: {exc}") from None
    if name is not None and name != identity.participant_id:
        raise OptionError(
            "state_dir",
            f"{state_dir} belongs to {identity.participant_id!r}, not {name!r}: "
            "use another state directory, or leave the name out",
        )
    return identity


def save_identity(state_dir: Path, identity: Identity) -> None:
    record = {
        "participant_id": identity.participant_id,
        "key_hex": identity.key.hex(),
        "listen": identity.listen,
    }
    write_whole(state_dir / CHAT_FILE, json.dumps(record))  # holds a private key: 0600
