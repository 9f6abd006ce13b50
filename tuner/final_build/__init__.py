"""Final build: a job's last step, and the server's review of an artifact a worker built.

:mod:`tuner.final_build.finalize` re-measures each task's top records side by side
(:mod:`~tuner.final_build.remeasure`, stored by :mod:`~tuner.final_build.remeasure_store`),
builds with the winners, compares the result with the zero-trial build
(:mod:`~tuner.final_build.final_choice`), verifies and publishes. For a remote worker's artifact
the server decides what is published (:mod:`~tuner.final_build.artifact_review`): it rebuilds the
artifact itself from stored evidence (:mod:`~tuner.final_build.rebuild_plan`,
:mod:`~tuner.final_build.rebuild`) or runs the worker's library in a sandbox
(:mod:`~tuner.final_build.sandbox`, :mod:`~tuner.final_build.sandbox_runner`), its helper
processes bounded by :mod:`~tuner.final_build.process_limits`. This file imports nothing.
"""
