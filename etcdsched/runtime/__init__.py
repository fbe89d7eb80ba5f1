"""What every running role shares in-process: the clock (time as a
parameter: services take a :class:`~etcdsched.runtime.clock.Clock`, tests a
fake one) and the Prometheus registry with every metric.

May import: nothing of etcdsched. Every layer above ``model`` may use it.
"""
