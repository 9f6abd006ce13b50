"""Measuring: how candidates are built and timed, and what a measured candidate's outcome is.

:mod:`tuner.measuring.builder_runner` sets up MetaSchedule's builder and runner (pooled workers,
local or RPC); :mod:`~tuner.measuring.outcomes` decides, in one place, whether a builder's and
runner's result is a measurement or a failure. This file imports nothing (``outcomes`` does not
import TVM).
"""
