"""The HTTP API (aiohttp): routes under ``/v1``, bearer-token auth,
``/openapi.json``, ``/metrics``, ``/healthz`` and ``/readyz``.

Import what you need from the submodules (``etcdsched.api.app.serve_api``,
``etcdsched.api.auth.create_admin_token``); this package imports nothing so
the client and CLI can use the API's models without loading the server side
(and the etcd client library).
"""
