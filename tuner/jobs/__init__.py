"""Jobs: a tuning job's lifecycle, from its plan to the records and artifact it keeps.

:mod:`tuner.jobs.job` runs a job in one process (``tunehub tune``, the service's in-process runs);
:mod:`~tuner.jobs.coordinator` turns jobs into leases for remote workers and takes their results
back, speaking the messages of :mod:`~tuner.jobs.protocol`. Both start a job through
:mod:`~tuner.jobs.start` with the task decisions and trial allotments of :mod:`~tuner.jobs.plan`,
over the model's task list in the database (:mod:`~tuner.jobs.workloads`). A worker's uploaded
records pass :mod:`~tuner.jobs.record_checks` and the physical limits of
:mod:`~tuner.jobs.plausibility` (with the memory bound of :mod:`~tuner.jobs.workload_bytes`)
before they count. This file imports nothing (``protocol``, ``start``, ``coordinator``,
``record_checks`` and ``plausibility`` do not import TVM: the REST layer imports them).
"""
