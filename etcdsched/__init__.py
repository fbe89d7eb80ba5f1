"""etcdsched: a distributed job scheduler with all coordination state in etcd.

The packages, each importing only those below it (checked by ``lint-imports``
against ``.importlinter``; ``docs/design.md``, "The packages", says why)::

    cli                          the ``etcdsched`` command
    agent | bench | client       one process's roles; the benchmark; the Python client
    api | scheduler | worker     the three roles, which meet only through etcd
    config                       one typed config per process
    logs                         run logs: written by workers, read by the API
    store                        the etcd store, its transactions and key layout
    runtime                      the clock and the metrics registry
    model                        pure: specs, triggers, records, the state machine
"""

__version__ = "0.1.0"
