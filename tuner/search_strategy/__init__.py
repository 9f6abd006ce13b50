"""MetaSchedule search-strategy wrappers."""
