"""The cost model that learns from the whole tuning database.

MetaSchedule's own ``XGBModel`` starts cold in every run: random predictions for its first 100
samples, then a full retrain on every update, and nothing kept afterwards. TuneHub's model is
trained on every record the database holds for the target and hardware, across workloads and
models, persisted in the database, loaded at the start of a job, fine-tuned on the job's own
measurements, and guarded against negative transfer by MetaSchedule's cold model.

Modules, one job each:

- :mod:`cost_model.features`: fixed-length candidate features folded from ``PerStoreFeature``;
  replaying stored traces into candidates.
- :mod:`cost_model.dataset`: a target's records as a :class:`TrainingSet`, extended incrementally;
  per-workload labels.
- :mod:`cost_model.booster`: XGBoost training (throughput regression or pairwise ranking),
  prediction, serialization.
- :mod:`cost_model.metrics`: pairwise rank accuracy and top-k recall within workloads.
- :mod:`cost_model.transfer`: :class:`TransferCostModel`, the MetaSchedule ``PyCostModel`` used
  while tuning, with its negative-transfer guard.
- :mod:`cost_model.store`: train, persist, load, retrain when enough new records arrived.
- :mod:`cost_model.evaluate`: held-out-workload evaluation against MetaSchedule's cold model.
"""
