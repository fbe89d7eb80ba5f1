"""``python -m etcdsched`` is the ``etcdsched`` command."""

from etcdsched.cli.main import main

main()
