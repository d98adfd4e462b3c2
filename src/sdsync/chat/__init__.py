"""The group chat over Waku Relay that ``sdsync chat`` runs (docs/chat.md): its identity
file, its view of a ReliableChannel, and one run of it."""

from sdsync.chat.identity import Identity, load_identity, save_identity
from sdsync.chat.run import DEFAULT_LISTEN, ChatOptions, run_chat
from sdsync.chat.session import ChatSession, Line

__all__ = [
    "DEFAULT_LISTEN",
    "ChatOptions",
    "ChatSession",
    "Identity",
    "Line",
    "load_identity",
    "run_chat",
    "save_identity",
]
