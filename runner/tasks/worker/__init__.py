"""The worker side of the task runner, on every node: the task loop (:class:`TaskLoop`: the scan
and its driver), the running set and the ordering-key chain, the backlog's order, the claim, the
execution of an attempt and its conclusion, the due-time timers."""
