"""etcdsched: a distributed job scheduler with all coordination state in etcd."""

__version__ = "0.1.0"
