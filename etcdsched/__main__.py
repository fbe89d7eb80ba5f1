"""``python -m etcdsched`` is the ``etcdsched`` command."""

from etcdsched.cli import main

main()
