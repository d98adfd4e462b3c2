"""19/WAKU2-LIGHTPUSH v3 and 2.0.0-beta1: messages and the service's checks and answers."""
