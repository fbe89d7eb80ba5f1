"""The pure model: what a job, a trigger, a run and a decision *are*.

Job specs and their validation (``spec``), triggers and their slots
(``triggers``, ``cronwall``, ``durations``), the records stored in etcd
(``records``), the run state machine (``states``, ``statemachine``), the
pure decisions of firing and placement (``planning``, ``placement``), the
error tree (``errors``) and the JSON codec (``codec``).

May import: nothing of etcdsched outside this package. No I/O, no asyncio,
no clock: functions take ``now_ms``. Everything above builds on it.
"""
