"""The submission server (`decodebench serve`): the only door between tenants and the queue.

Tenants call it over HTTP with a bearer token (`tokens.py`); it validates every request as
`decodebench validate` does, applies the tenant's policy and quotas, and is the only client
that writes sweeps to Redis (`service.py`, through `controller.launch.submit` and
`worker.sweepstate`). `app.py` is the HTTP layer (FastAPI), `client.py` what the CLI's
`--api` mode calls. It keeps no state of its own: every replica reads and writes Redis.
"""
