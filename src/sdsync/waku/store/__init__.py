"""13/WAKU2-STORE v3 (``/vac/waku/store-query/3.0.0``): messages, model, service, client."""
