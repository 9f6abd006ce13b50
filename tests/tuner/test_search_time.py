"""Where a search's time goes (tuner/engine/search_time.py): MetaSchedule's profiler scopes grouped
into the phases of a trial. A real run's split is checked in tests/tuner/test_tune_job.py."""

from __future__ import annotations

import pytest

from tuner.engine.search_time import PHASES, SearchTime


def test_scopes_group_into_phases_and_the_rest_is_other() -> None:
    scopes = {
        "Total": 10.0,
        "EvoSearch/SampleInitPopulation": 1.0,
        "EvoSearch/Evolve/Mutation": 3.0,
        "EvoSearch/Evolve/Misc": 0.5,
        "EvoSearch/Evolve/Misc/CopyMeasuredWorkloads": 0.4,  # inside Misc: not counted again
        "EvoSearch/Evolve/PredictNormalizedScore": 0.25,
        "SendToBuilder": 2.0,
        "SendToRunner": 1.5,
        "MeasureCallback/UpdateCostModel": 0.5,
        "MeasureCallback/AddToDatabase": 0.25,
        "SomethingNew": 9.0,  # an unknown scope is in "other"
    }
    split = SearchTime.from_scopes(scopes, trials=20)
    phases = dict(split.phases)
    assert list(phases) == [*PHASES, "other"]
    assert phases == pytest.approx(
        {
            "sample": 1.0,
            "mutate": 3.5,
            "predict": 0.25,
            "build": 2.0,
            "run": 1.5,
            "update": 0.5,
            "record": 0.25,
            "other": 1.0,
        }
    )
    assert split.to_json()["trials_per_sec"] == 2.0
    assert split.describe().startswith("search time 10.0 s, 2.00 trials/s: mutate 35%, build 20%")


def test_nothing_timed() -> None:
    split = SearchTime.from_scopes({})
    assert split.total_secs == 0 and dict(split.phases)["other"] == 0
    assert split.to_json()["trials_per_sec"] is None
    assert split.describe() == "search time: nothing timed"
