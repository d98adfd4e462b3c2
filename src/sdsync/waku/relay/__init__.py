"""11/WAKU2-RELAY: topics and autosharding (the gossipsub node is the transport's)."""
