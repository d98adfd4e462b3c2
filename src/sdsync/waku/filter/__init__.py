"""12/WAKU2-FILTER v2: messages and the service's subscription table."""
