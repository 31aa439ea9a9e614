"""Global resource planner: how many GPUs train, how many roll out (and with which tensor-parallel
instance layout), how many are hybrid, with which training parallelism, and when moving pays.

Modules, read in this order: `settings` (the base of the settings records: validated models that
the config's `planner` section composes), `profiles` (hardware and model data), `workload` (length
buckets), `cost_model` (seconds and bytes, no search), `training_search`, `rollout_search`,
`planner` (the global split), `trigger` (when to apply a new plan), `calibrate` (fit the cost
model's coefficients to measured timings). Everything here is pure: no I/O, no clock reads.
"""
