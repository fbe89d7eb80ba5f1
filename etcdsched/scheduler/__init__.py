"""The scheduler role: partitions owned through leases (``ownership``),
firing due slots into runs (``firing``, ``firing_conflicts``,
``direct_fire``, ``overlap``), the firing brake (``backpressure``),
placement of runs on workers (``placement_loop``, ``placer``, ``assigner``,
``assign_requests``, ``capacity``), recovery of runs whose worker vanished
(``recovery``), retention (``retention``), and the service that runs them
all per owned partition (``service``).

May import: ``model``, ``runtime``, ``store``, ``logs`` and ``config``.
Never ``worker``, ``api`` or ``cli``: a scheduler and a worker meet only
through etcd.
"""
