"""The metadata protocol (``/vac/waku/metadata/1.0.0``): each side of a new connection
says which cluster and shards it serves."""

from __future__ import annotations

from dataclasses import dataclass

from sdsync.waku.metadata import waku_metadata_pb2 as metadata_pb
from sdsync.waku.rpc import Rpc, optional_field

METADATA_PROTOCOL = "/vac/waku/metadata/1.0.0"


@dataclass(frozen=True, slots=True)
class WakuMetadata(Rpc[metadata_pb.WakuMetadata]):
    """The metadata protocol's request and its response alike: a cluster and its shards.

    Written as nwaku writes it: the shards twice, in field 2 one tag each (what js-waku
    reads) and in field 3 packed (what go-waku reads, and all it reads). Read as nwaku
    reads it: field 3 when it holds any shard, else field 2, packed or not. So these are
    not @waku/proto's bytes when there are shards (it writes field 2 only), though each
    side reads the other's."""

    _pb_type = metadata_pb.WakuMetadata

    cluster_id: int | None = None
    shards: tuple[int, ...] = ()

    def _to_pb(self) -> metadata_pb.WakuMetadata:
        return metadata_pb.WakuMetadata(
            cluster_id=self.cluster_id, shards=self.shards, shards_packed=self.shards
        )

    @classmethod
    def _from_pb(cls, parsed: metadata_pb.WakuMetadata) -> WakuMetadata:
        return cls(
            cluster_id=optional_field(parsed, "cluster_id"),
            shards=tuple(parsed.shards_packed or parsed.shards),
        )
