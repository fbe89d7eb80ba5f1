"""The ``etcdsched`` command line: the click commands (``main``), output and
argument helpers (``support``), waiting for runs (``wait``), and starting
agent processes for ``up`` and ``agent`` (``processes``).

May import anything below it: the client, the agent, the benchmark.
"""
