"""The ``etcdsched`` command line: the click commands (``main``; ``job edit``
in ``job_edit``, ``job set`` in ``job_set``), output and argument helpers
(``support``, ``run_view``), reading job files (``yaml_io``), waiting for
runs (``wait``) with repeated warnings counted (``warnings``), and starting
agent processes for ``up`` and ``agent`` (``processes``).

May import anything below it: the client, the agent, the benchmark.
"""
