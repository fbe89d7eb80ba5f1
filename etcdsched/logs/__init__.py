"""Run logs: where an attempt's output is written while it runs and read
from afterwards. ``store``: the interface and the directory store; ``s3``
(with ``s3_writer`` and ``bucket``): the S3-compatible object store;
``factory``: which of them a URL names.

May import: ``etcdsched.model``, ``etcdsched.runtime`` and
``etcdsched.store`` (for the id rules). The worker writes logs, the API
reads them, the scheduler's retention archives and deletes them.
"""
