"""The store: every byte etcdsched keeps, and how it is written.

The key-value interface (``kv``) and its etcd implementation (``etcd``),
the write coalescer (``coalesce``), watched prefix caches (``cache``),
leased sessions and their renewal thread (``session``, ``lease_renewer``),
the key layout (``keys``), the record operations written as transactions
(``jobs``, ``job_create``, ``job_batch``, ``job_runs``, ``runs``, ``ledger``),
and running etcd itself (``embedded``, ``etcd_cluster``).

May import: ``etcdsched.model`` and ``etcdsched.runtime``. Nothing here
knows about scheduling or workers; the roles above compose it.
"""
