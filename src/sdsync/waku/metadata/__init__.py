"""66/WAKU2-METADATA (``/vac/waku/metadata/1.0.0``): cluster and shards."""
