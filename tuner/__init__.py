"""tuner: tuning jobs, the one MetaSchedule search, its measurements and the final build.

One sub-package per role (as TVM's ``meta_schedule``): :mod:`tuner.jobs` (a job's lifecycle:
planning, the coordinator of lease workers, the worker protocol and the checks on what workers
upload), :mod:`tuner.engine` (the search itself: ``run_search``, its design spaces, cost models,
siblings and reports), :mod:`tuner.measuring` (MetaSchedule's builder and runner, the outcome of
a measured candidate) and :mod:`tuner.final_build` (re-measure, build, compare, publish, and the
server's rebuild or sandboxed check of a worker's artifact). The MetaSchedule roles the search
plugs in have a folder each: :mod:`tuner.database`, :mod:`tuner.search_strategy`,
:mod:`tuner.task_scheduler` and :mod:`tuner.measure_callback`. Importing a package imports
nothing: each module imports TVM only where it needs to.
"""
