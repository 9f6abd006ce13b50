"""MetaSchedule measure callbacks: where each measured batch is reported."""
