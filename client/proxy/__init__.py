"""`meancache proxy`: the device's cache for every app, behind the OpenAI Chat Completions
API on loopback (app.py routes; apps.py who asks; eligibility.py what the cache may
answer; partitions.py the caches; exchanges.py the conversations it answered; relay.py
what goes straight upstream; wire.py the request and response shapes; service.py starts
it)."""
