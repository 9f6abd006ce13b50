"""MetaSchedule task schedulers and the seeds they measure before a task's batch."""
