"""Libra: GPU management for agentic RL post-training.

The core package. It holds pure policies (planner, scheduler, pools), engines, environments,
the trainer and the simulator. It imports none of `flows`, `tasks`, `storage` or `dashboards`.
"""

__version__ = "0.1.0"

from libra import native

native.install()  # the simulator's compiled core, where it is built from the sources in the tree
