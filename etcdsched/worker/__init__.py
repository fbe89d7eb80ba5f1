"""The worker role: taking assigned runs (``service``), running one attempt
(``attempt`` with its halves ``start`` and ``report``, on the worker as
``host`` describes it, tracked as ``running``), preparing and starting the
job's process behind a gate (``executor``, ``starter``, ``job_commands``,
``process_group``), self-fencing when the lease may be gone (``watchdog``),
and the small asyncio pieces they share (``interrupts``, ``gather``).

May import: ``model``, ``runtime``, ``store``, ``logs`` and ``config``.
Never ``scheduler``, ``api`` or ``cli``.
"""
