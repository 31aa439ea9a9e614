"""Cluster simulator: the same planner, routers and pool decisions as real runs, on simulated GPUs.

Modules, read in this order: `engine` (a discrete-event core with a simulated clock), `workloads`
(agentic workload generators fitted to real traces, with drift), `rollout` (rollout instances with
continuous batching, prefill, KV capacity and tool delays).
"""
