"""Engine: the one tuning search, MetaSchedule's ``tune_tasks`` with TuneHub's roles plugged in.

:func:`tuner.engine.search.run_search` is the search every job runs, over the design space of
:mod:`~tuner.engine.space` with the cost model :mod:`~tuner.engine.cost_models` chooses, seeded
from a task's faster siblings (:mod:`~tuner.engine.siblings`), timed by MetaSchedule's profiler
(:mod:`~tuner.engine.search_time`); :mod:`~tuner.engine.task_tuning` runs it on a lease worker's
view, and :mod:`~tuner.engine.reports` holds its plain results, which the worker protocol
carries. This file imports nothing (``reports``, ``siblings``, ``search_time`` and
``cost_models`` do not import TVM at module level).
"""
