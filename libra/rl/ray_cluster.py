"""A training run's workers on a Ray cluster: the connection, the hosts that are alive, and the
placement groups that put the plan's engines and the trainer's ranks on their hosts.

    ray = RayCluster.connect(address, timeout_s)     # ray.init(address=...) in the "libra" namespace
    cluster = cluster_of_hosts(ray.hosts(), cores_per_worker)
    engine = ray.engine("engine-0", host, kind, policy_dir, cores=(0,), ...)   # an actor in its own group
    core, hybrids = ray.pool_providers(["10.0.0.2", "10.0.0.3"], [])           # the trainer's ranks, spread

Every component (an engine, the trainer's pool) gets a placement group of its own, one bundle per
actor, each bundle bound to the host the plan chose (Ray's `node:<address>` resource); the bundles
hold no CPUs: which cores a worker's actors use is Libra's plan (they pin themselves), so a
colocated plan may put an engine and a trainer rank on one worker. Moving a component removes its
group and actors and makes new ones. A group that cannot be placed within the timeout (its host is
gone) is a `HostLostError` naming the host.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from libra.config import LibraConfig
from libra.errors import HostLostError, LibraError, first_line
from libra.rl.cluster import Host

NAMESPACE = "libra"
NODE_SHARE = 0.001  # of a node's `node:<address>` resource: binds a bundle to that node, holds nothing


def address_of(config: LibraConfig) -> str:
    """The Ray cluster a placed run runs on: cluster.ray_address, else RAY_ADDRESS; empty: none."""
    if config.placement.strategy == "none":
        return ""
    return config.cluster.ray_address or os.environ.get("RAY_ADDRESS", "")


class RayCluster:
    def __init__(self, timeout_s: float) -> None:
        import ray

        self.ray = ray
        self.timeout_s = timeout_s
        self.groups: dict[str, Any] = {}  # component -> its placement group

    @classmethod
    def connect(cls, address: str, timeout_s: float = 120.0) -> RayCluster:
        import ray

        if not ray.is_initialized():
            try:
                ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise LibraError(f"cannot join the Ray cluster at {address!r} ({first_line(exc)}); start it "
                                 "(`ray start --head`) or fix cluster.ray_address / RAY_ADDRESS") from None
        return cls(timeout_s)

    def hosts(self) -> tuple[Host, ...]:
        """The hosts alive now."""
        return tuple(Host(node["NodeManagerAddress"], int(node["Resources"].get("CPU", 0)),
                          int(node["Resources"].get("GPU", 0)), float(node["Resources"].get("memory", 16 * 2**30)))
                     for node in self.ray.nodes() if node.get("Alive"))

    def here(self) -> str:
        """This process's host address (where the trainer's control store listens)."""
        return self.ray.util.get_node_ip_address()

    def group(self, component: str, hosts: Sequence[str]) -> Any:
        """A placement group for `component`: one bundle per entry of `hosts`, on that host (an
        earlier group of the component is removed first)."""
        from ray.util.placement_group import placement_group

        self.release(component)
        group = placement_group([{f"node:{host}": NODE_SHARE} for host in hosts], strategy="PACK",
                                name=f"libra-{component}-{os.getpid()}")
        try:
            self.ray.get(group.ready(), timeout=self.timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            self.ray.util.remove_placement_group(group)
            alive = {h.address for h in self.hosts()}
            missing = sorted(set(hosts) - alive)
            raise HostLostError(missing[0] if missing else "", f"{component} could not be placed on hosts "
                                f"{', '.join(dict.fromkeys(hosts))} within {self.timeout_s:.0f} s"
                                + (f" (not in the cluster: {', '.join(missing)})" if missing else "")) from None
        self.groups[component] = group
        return group

    def bundle(self, group: Any, index: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)

    def release(self, component: str) -> None:
        group = self.groups.pop(component, None)
        if group is not None:
            try:
                self.ray.util.remove_placement_group(group)
            except Exception:  # noqa: BLE001 - its host (and the group with it) may be gone
                pass

    def engine(self, component: str, host: str, kind: str, model_dir: str | Path, size: int,
               cores: Sequence[int] | None, gpus: Sequence[int] | None, max_context: int):
        """A rollout engine on `host` (its cores or GPUs there), as an actor of its own group."""
        from libra.rollout.remote import RemoteEngine

        group = self.group(component, [host])
        return RemoteEngine(kind, model_dir, size, cores, gpus, max_context, host=host, strategy=self.bundle(group, 0))

    def pool_providers(self, core_hosts: Sequence[str], hybrid_hosts: Sequence[str]):
        """Providers for the trainer's pool: core rank r on `core_hosts[r]`, hybrid i on
        `hybrid_hosts[i]`, all in one group (the trainer's)."""
        from libra.pools.providers import RayActors

        group = self.group("trainer", [*core_hosts, *hybrid_hosts])
        core = RayActors({f"core-{r}": self.bundle(group, r) for r in range(len(core_hosts))})
        hybrids = RayActors({f"hybrid-{i}": self.bundle(group, len(core_hosts) + i) for i in range(len(hybrid_hosts))})
        return core, hybrids

    def close(self) -> None:
        for component in list(self.groups):
            self.release(component)
