"""Who a chat participant is, kept in its state directory as ``chat.json``.

The file holds the participant id, the libp2p private key and the address we last
listened on — reused so that the ``--peer`` addresses others were given stay valid. It
holds a private key: it is written owner-only, whole or not at all.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from sdsync.errors import LocalProtocolError, OptionError

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
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / CHAT_FILE
    tmp = path.with_suffix(".tmp")
    record = {
        "participant_id": identity.participant_id,
        "key_hex": identity.key.hex(),
        "listen": identity.listen,
    }
    # The file holds a private key: owner-only, written whole or not at all.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(record, out)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)
