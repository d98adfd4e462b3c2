"""What the harnesses of other implementations' nodes share: finding their binary (an
environment variable, else the tool beside the checkout that prints its path) and a free
loopback port, and one call to its REST API."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

SHARED_TOOLS = Path(__file__).resolve().parents[4] / "shared" / "tools"
"""``shared/tools`` beside the repository, as in CI."""


def tool_binary(env: str, tool: Path, what: str, unavailable: type[Exception]) -> str:
    """The binary ``env`` names, else the one ``tool`` prints (its first run may unpack
    it: allowed 300 s); ``unavailable`` saying how to provide ``what`` if neither works."""
    explicit = os.environ.get(env)
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit
        raise unavailable(f"{env}={explicit} is not an executable {what} binary")
    try:
        found = subprocess.run([str(tool)], capture_output=True, text=True, timeout=300, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise unavailable(
            f"{env} is unset and {tool} gave no {what} binary ({exc}); set {env} to one"
        ) from None
    binary = found.stdout.strip()
    if not os.access(binary, os.X_OK):
        raise unavailable(f"{tool} printed {binary!r}, not an executable")
    return binary


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rest_call(url: str, method: str, body: Any = None, *, timeout_s: float = 10.0) -> Any:
    """One JSON call to ``url``: its JSON answer (or text). HTTP errors raise
    ``urllib.error.HTTPError``, whose body names the node's complaint."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        text = response.read().decode()
    try:
        return json.loads(text)
    except ValueError:
        return text
