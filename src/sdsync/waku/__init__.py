"""The Waku protocols, a folder each (as nwaku keeps them): so far ``sync``, Waku Sync
(``/vac/waku/reconciliation/1.0.0`` and ``/vac/waku/transfer/1.0.0``) between store nodes.

They sit above the transport, whose Waku node contract they run on
(:mod:`sdsync.transport.waku_node`), and below the store node that mounts them.
"""
