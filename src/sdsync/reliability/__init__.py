"""Reliability: the seed-004 API (:class:`~sdsync.runtime.manager.ReliabilityManager`)
served over gRPC to applications in any language (``sdsync reliability serve``)."""

from sdsync.reliability.server import (
    EventHub,
    ReliabilityServer,
    ReliabilityService,
    TokenCheck,
    request_limit,
)

__all__ = ["EventHub", "ReliabilityServer", "ReliabilityService", "TokenCheck", "request_limit"]
