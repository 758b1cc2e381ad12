"""The master's duties (only the current master runs them): the reaper and the rounds
(:mod:`.duties`), recurring schedules, incidents, retention of finished tasks."""
