"""Task types latchwork ships on top of the runner: concurrent exactly-once stream copies
(:mod:`.streams`) and the diagnostic types (:mod:`.diag`)."""
