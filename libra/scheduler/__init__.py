"""Routing trajectories between rollout-instance buckets at tool returns.

Modules, read in this order: `keys` (how a tool return is reduced to a tree edge), `causal_tree`
(the prefix tree of past trajectories and its O(1) cursor), `lengths` (a prompt's likely lengths
from its sibling samples), `routers` (C-MLFQ, Libra's improved router and the baselines behind one
interface), `replay` (evaluating routers on a per-turn trace in RL order) and `metrics`.
"""
