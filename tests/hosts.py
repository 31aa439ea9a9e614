"""The project's own test hosts: network namespaces on this machine, each with its own address on a
bridge (veth pairs), its own /etc/hosts and an empty resolver configuration, and a Ray cluster over
them: a head (the driver's host; no workers unless given CPUs) and worker hosts with CPUs of their
own to Ray.

    with NetnsHosts(workers=2, cpus=2) as hosts:           # needs root and iproute2 (`ip netns`)
        hosts.run_on(hosts.head, [sys.executable, ...])    # a process on the head's host
        hosts.kill(hosts.workers[1])                      # the host disappears: every process in it killed
        hosts.start(hosts.workers[1])                     # and comes back (a new Ray node, same address)

Everything is created on entry and removed on exit (namespaces, bridge, their /etc/netns files,
the processes in them), also when the block fails. The hosts share this machine's file system, as a
cluster's hosts share one for checkpoints and the store. Ray notices a dead host after missed health
checks: the head checks every second and gives up after three.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_health_check_period_ms": "1000",
           "RAY_health_check_failure_threshold": "3", "RAY_health_check_timeout_ms": "1000"}


def available() -> str:
    """'' when this machine can make test hosts, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (Debian's iproute2)"
    probe = subprocess.run(["ip", "netns", "add", f"libra-probe-{os.getpid()}"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns add` failed: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", f"libra-probe-{os.getpid()}"], check=False)
    return ""


@dataclass(frozen=True)
class NetnsHost:
    name: str  # its network namespace
    address: str
    cpus: int  # what it offers Ray


class NetnsHosts:
    def __init__(self, workers: int = 2, cpus: int = 2, temp: Path | None = None, head_cpus: int = 0) -> None:
        """`workers` worker hosts of `cpus` CPUs each, beside the head (the driver's host, with
        `head_cpus`: 0 leaves it no workers; `workers=0, head_cpus=4` is a cluster of one host)."""
        tag = os.getpid() % 10_000
        self.bridge = f"lb{tag}"
        self.subnet = f"10.{100 + tag % 100}.{tag % 250}"
        self.head = NetnsHost(f"libra{tag}-head", f"{self.subnet}.11", head_cpus)
        self.workers = tuple(NetnsHost(f"libra{tag}-w{i}", f"{self.subnet}.{12 + i}", cpus) for i in range(workers))
        self.temp = temp or Path(f"/tmp/libra-hosts-{tag}")
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PREFECT_", "MLFLOW_"))},
                    **RAY_ENV}

    @property
    def hosts(self) -> tuple[NetnsHost, ...]:
        return (self.head, *self.workers)

    @property
    def ray_address(self) -> str:
        return f"{self.head.address}:6379"

    # -- the network -------------------------------------------------------------------------------

    def __enter__(self) -> NetnsHosts:
        try:
            self._ip("link", "add", self.bridge, "type", "bridge")
            self._ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            hosts_file = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts)
            for i, host in enumerate(self.hosts):
                self._ip("netns", "add", host.name)
                veth = f"{self.bridge}v{i}"
                self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.name)
                self._ip("link", "set", veth, "master", self.bridge, "up")
                self._ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", "eth0")
                self._ip("-n", host.name, "link", "set", "eth0", "up")
                self._ip("-n", host.name, "link", "set", "lo", "up")
                self._ip("-n", host.name, "route", "add", "default", "via", f"{self.subnet}.1")
                etc = Path("/etc/netns") / host.name  # `ip netns exec` binds these over /etc/hosts, /etc/resolv.conf
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "hosts").write_text(hosts_file)
                (etc / "resolv.conf").write_text("")  # no resolver: a name lookup fails at once, not after a timeout
            self.temp.mkdir(parents=True, exist_ok=True)
            for host in self.hosts:
                self.start(host)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for host in self.hosts:
            self.kill(host)
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / host.name, ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.temp, ignore_errors=True)

    @staticmethod
    def _ip(*args: str) -> None:
        out = subprocess.run(["ip", *args], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")

    # -- processes -----------------------------------------------------------------------------------

    def command(self, host: NetnsHost, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", host.name, *argv]

    def run_on(self, host: NetnsHost, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start `argv` on `host` (its own process group)."""
        env = {**self.env, **kwargs.pop("env", {})}
        return subprocess.Popen(self.command(host, argv), env=env, start_new_session=True, **kwargs)

    def start(self, host: NetnsHost) -> None:
        """Ray on `host`: the head, or a worker node joining it; returns once it is up."""
        argv = [RAY, "start", f"--node-ip-address={host.address}", f"--num-cpus={host.cpus}", "--num-gpus=0",
                "--disable-usage-stats"]
        if host == self.head:
            argv += ["--head", "--port=6379", "--include-dashboard=false", f"--temp-dir={self.temp / 'ray'}"]
        else:
            argv += [f"--address={self.ray_address}"]
        out = subprocess.run(self.command(host, argv), env=self.env, capture_output=True, text=True, timeout=180)
        if out.returncode != 0:
            raise RuntimeError(f"ray start on {host.name}: {out.stdout[-1500:]}{out.stderr[-1500:]}")

    def pids(self, host: NetnsHost) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", host.name], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def kill(self, host: NetnsHost) -> None:
        """The host disappears: SIGKILL every process in its namespace (until none is left)."""
        for _ in range(50):
            pids = self.pids(host)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
