"""What every running role shares in-process: the clock (time as a
parameter: services take a :class:`~etcdsched.runtime.clock.Clock`, tests a
fake one), the Prometheus registry with every metric, and warnings that
repeat, said once and then counted (``ratelimited_log``).

May import: nothing of etcdsched. Every layer above ``model`` may use it.
"""
