"""Run logs: where an attempt's output is written while it runs and read
from afterwards (``store``: the interface and the directory store).

May import: ``etcdsched.model``, ``etcdsched.runtime`` and
``etcdsched.store`` (for the id rules). The worker writes logs, the API
reads them, the scheduler's retention deletes them.
"""
