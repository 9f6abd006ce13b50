"""MetaSchedule databases a search reads (the SQL adapter itself lives in :mod:`db`)."""
