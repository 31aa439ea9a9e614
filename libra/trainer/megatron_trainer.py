"""The megatron-core trainer: the torch trainer's interface (`train_step`, `save_weights`, the
optimizer state, `updates`) over `tp` x `pp` x `dp` rank processes, each a `MegatronRank`.

    trainer = MegatronTrainer(policy_dir, config.trainer, config.rollout, Layout(tp=2))
    stats = trainer.train_step(samples)     # one update by every rank
    trainer.relayout(Layout(dp=2))          # the same weights and optimizer state, sharded anew
    trainer.place(cores)                    # the same layout on other cores (GPUs: ranks restarted)
    trainer.save_weights(directory)         # HF safetensors + config, as the torch trainer writes them
    trainer.close()

The ranks are processes of their own (spawned, one process group: gloo on the CPU, NCCL on GPUs),
started by the constructor and driven over one pipe each: every rank gets the same command, runs it
(the collectives meet), and answers; rank 0's answer is the result. The run's process keeps no
torch process group of its own, so the rollout engines beside it are untouched. Weights leave in HF
form and the optimizer state in the torch trainer's layout (`MegatronRank.optimizer_state`), so a
checkpoint of one backend resumes on the other, or on another layout.

A rank that fails answers with its traceback and the trainer stops every rank and raises its last
line; a rank that dies (killed, out of memory) is noticed within `poll_s` and raises RankLostError.
"""

from __future__ import annotations

import logging
import os
import socket
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from libra.clock import Clock, Stopwatch, WallClock
from libra.config import RolloutConfig, TrainerConfig
from libra.errors import LibraError, RankLostError
from libra.trainer.layout import Layout, rank_units
from libra.trainer.megatron_convert import Sharding
from libra.trainer.megatron_rank import read_architecture, save_hf
from libra.trainer.samples import TrainingSample
from libra.trainer.trainer import UpdateStats, update_stats

START_TIMEOUT_S = 600.0  # a rank's start: importing megatron, building and loading its shard


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(rank: int, layout: Layout, port: int, conn, policy_dir: str, config: TrainerConfig, temperature: float,
           device: str, cores: tuple[int, ...], reference_dir: str, threads: int) -> None:
    """A rank process: pinned to `cores` (if any) with a thread each, join the group, build the
    shard, then answer commands until "stop"."""
    import torch.distributed as dist

    from libra.trainer.megatron_rank import MegatronRank

    try:
        # megatron's import probes for Triton, which a CPU build lacks: torch logs that on stderr
        logging.getLogger("torch._library.triton").setLevel(logging.ERROR)
        if cores:
            os.sched_setaffinity(0, cores)
        torch.set_num_threads(len(cores) or max(1, threads))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        where = torch.device(device)
        if where.type == "cuda":
            if where.index is None:
                where = torch.device("cuda", rank % max(1, torch.cuda.device_count()))
            torch.cuda.set_device(where)
        dist.init_process_group("nccl" if where.type == "cuda" else "gloo", rank=rank, world_size=layout.world)
        worker = MegatronRank(policy_dir, config, layout, temperature, where, reference_dir or None)
        conn.send(("ok", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        command, argument = conn.recv()
        if command == "stop":
            break
        try:
            if command == "step":
                samples, index = argument
                answer: Any = worker.train_step(samples, index)
            elif command == "weights":
                answer = worker.hf_weights()
            elif command == "optimizer":
                answer = worker.optimizer_state()
            elif command == "load_optimizer":
                answer = worker.load_optimizer_state(argument)
            elif command == "threads":
                answer = torch.set_num_threads(max(1, argument))
            elif command == "pin":
                os.sched_setaffinity(0, argument)
                answer = torch.set_num_threads(len(argument))
            else:
                raise ValueError(f"unknown command {command!r}")
            conn.send(("ok", answer))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
            break
    dist.destroy_process_group()


class MegatronTrainer:
    def __init__(self, policy_dir: str | Path, trainer: TrainerConfig, rollout: RolloutConfig | None = None,
                 layout: Layout | None = None, device: str = "cpu", reference_dir: str | Path | None = None,
                 threads: int | None = None, poll_s: float = 0.05, units: Sequence[int] = (),
                 clock: Clock | None = None) -> None:
        """`policy_dir`: the HF weights to start from; `reference_dir`: the KL term's frozen reference
        (default `policy_dir`); `threads`: intra-op threads of each rank (default: this process's
        share, divided among the ranks); `units`: the trainer's workers' CPU cores or, on `cuda`, GPU
        indices, shared among the ranks (`rank_units`): a rank pinned to its run of cores with a
        thread each, or on the first GPU of its run (empty: ranks unpinned, rank r on GPU r); `clock`:
        what an update's and a move's seconds are read on (default: wall time)."""
        from libra.devices import torch_device

        self.config = trainer
        self.layout = layout or Layout()
        self.policy_dir = Path(policy_dir)
        self.reference_dir = Path(reference_dir or policy_dir)
        self.device = torch_device(device)
        self.temperature = (rollout or RolloutConfig()).temperature
        self.poll_s = poll_s
        self.clock = clock or WallClock()
        self.arch = read_architecture(policy_dir)  # a clear error before any process starts
        self.updates = 0
        self.units = tuple(units)
        self._threads = threads
        self._conns: list = []
        self._ranks: list = []
        self._start(self.layout, self.policy_dir)

    def _check(self, layout: Layout, units: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """`layout` on `units` (each rank's run of them), or a clear error before anything stops or starts."""
        Sharding(layout.tp, layout.pp).check(self.arch)
        if self.device.type == "cuda" and torch.cuda.device_count() < layout.world:
            raise LibraError(f"layout {layout} needs {layout.world} GPUs; this machine has "
                             f"{torch.cuda.device_count()}")
        return rank_units(layout, tuple(units)) if units else ((),) * layout.world

    def _start(self, layout: Layout, weights: Path) -> None:
        """Start `layout`'s ranks from the HF weights in `weights`, each on its units (a failed
        start stops every rank it started)."""
        units = self._check(layout, self.units)
        share = self._threads or max(1, torch.get_num_threads() // layout.world)
        context = mp.get_context("spawn")
        port = _free_port()
        self.layout = layout
        try:
            for rank in range(layout.world):
                mine, theirs = context.Pipe()
                process = context.Process(target=_serve, name=f"megatron-rank-{rank}", daemon=True,
                                          args=(rank, layout, port, theirs, str(weights), self.config, self.temperature,
                                                *self._where(units[rank]), str(self.reference_dir), share))
                process.start()
                theirs.close()
                self._conns.append(mine)
                self._ranks.append(process)
            self._answers(START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def _where(self, units: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
        """A rank's device and the cores it is pinned to, from its run of units."""
        if self.device.type == "cuda":
            return (f"cuda:{units[0]}" if units else "cuda"), ()
        return str(self.device), units

    def relayout(self, layout: Layout, units: Sequence[int] = ()) -> float:
        """Train on `layout` from now on (on `units`, see the constructor): the weights and AdamW's
        state leave the old ranks whole (HF names, the torch trainer's layout), the old ranks stop,
        and the new ranks start from them, sharded anew. A layout the model or the units cannot take
        is refused before anything stops; new ranks that fail to start give way to the old layout
        again (from the same weights and state) before the error is raised. Returns the seconds it took."""
        import tempfile

        self._check(layout, units)
        watch = Stopwatch(self.clock)
        with tempfile.TemporaryDirectory(prefix="libra-relayout-") as directory:
            self.save_weights(directory)
            state = self.optimizer_state()
            old_layout, old_units = self.layout, self.units
            self.close()
            try:
                self.units = tuple(units)
                self._start(layout, Path(directory))  # the ranks hold their shards once started
            except BaseException:
                self.units = old_units
                self._start(old_layout, Path(directory))
                self.load_optimizer_state(state)
                raise
        self.load_optimizer_state(state)
        return watch.seconds()

    def place(self, units: Sequence[int]) -> float:
        """Run the ranks on `units` in the same layout: CPU ranks are pinned anew (`rank_units`, a
        thread per core); GPU ranks are restarted on the new GPUs (`relayout`). Seconds taken."""
        if self.device.type == "cuda":
            return self.relayout(self.layout, units)
        watch = Stopwatch(self.clock)
        self._call("pin", per_rank=self._check(self.layout, units))
        self.units = tuple(units)
        return watch.seconds()

    # -- talking to the ranks --------------------------------------------------------------------

    def _call(self, command: str, argument: Any = None, timeout_s: float = 24 * 3600.0,
              per_rank: Sequence[Any] | None = None) -> Any:
        """Send every rank `command` (with `argument`, or with its own item of `per_rank`); rank 0's answer."""
        if not self._conns:
            raise LibraError(f"the megatron trainer's ranks ({self.layout}) are stopped; open the run again")
        for rank, conn in enumerate(self._conns):
            try:
                conn.send((command, argument if per_rank is None else per_rank[rank]))
            except OSError:  # its end of the pipe is gone: the rank died between commands
                raise self._lost(rank) from None
        return self._answers(timeout_s)

    def _lost(self, rank: int) -> RankLostError:
        """The error for a rank that died, once every rank is stopped."""
        code = self._ranks[rank].exitcode
        self.close()
        return RankLostError(rank, f"megatron trainer rank {rank} ({self.layout}) died (exit code {code})")

    def _answers(self, timeout_s: float) -> Any:
        """Every rank's answer (rank 0's returned); a failed or dead rank stops them all."""
        answers: dict[int, Any] = {}
        waited = Stopwatch()
        while len(answers) < len(self._conns):
            for rank, conn in enumerate(self._conns):
                if rank in answers or not conn.poll(self.poll_s / len(self._conns)):
                    continue
                try:
                    status, value = conn.recv()
                except EOFError:  # it died: told below
                    continue
                if status == "error":
                    self.close()
                    last = value.strip().splitlines()[-1]
                    if os.environ.get("LIBRA_DEBUG"):
                        last = value
                    raise LibraError(f"megatron trainer rank {rank} ({self.layout}) failed: {last}")
                answers[rank] = value
            dead = [r for r, p in enumerate(self._ranks) if r not in answers and not p.is_alive()]
            if dead and not any(self._conns[r].poll() for r in dead):  # gone without a last word
                raise self._lost(dead[0])
            if waited.seconds() > timeout_s:
                self.close()
                raise LibraError(f"megatron trainer ranks {sorted(set(range(len(self._conns))) - answers.keys())} "
                                 f"did not answer within {timeout_s:.0f} s")
        return answers[0]

    # -- the trainer's interface -----------------------------------------------------------------

    def train_step(self, samples: Sequence[TrainingSample]) -> UpdateStats:
        """One update on the step's samples, by every rank."""
        watch = Stopwatch(self.clock)
        sums, padded, applied = self._call("step", (list(samples), self.updates))
        self.updates += 1
        tokens = float(sum(s.policy_tokens for s in samples))
        return update_stats(sums, tokens, len(samples), padded, applied, watch.seconds())

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's weights in HF names (gathered from the shards)."""
        return self._call("weights")

    def save_weights(self, directory: str | Path) -> None:
        """The weights in HF format (safetensors and config), loadable by vLLM and transformers."""
        save_hf(self.policy_dir, self.hf_state_dict(), directory)

    def optimizer_state(self) -> dict:
        return {"optimizer": self._call("optimizer"), "updates": self.updates}

    def load_optimizer_state(self, state: dict) -> None:
        self._call("load_optimizer", state["optimizer"])
        self.updates = int(state["updates"])

    def set_threads(self, count: int) -> None:
        """The ranks' intra-op threads: `count` shared among them (unpinned ranks; pinned ones keep a
        thread per core)."""
        if not self.units:
            self._call("threads", max(1, count // self.layout.world))

    def threads(self) -> int:
        return torch.get_num_threads()

    def close(self) -> None:
        """Stop the ranks (asked, then ended)."""
        for conn in self._conns:
            try:
                conn.send(("stop", None))
            except (OSError, ValueError):
                pass
        waited = Stopwatch()
        for process in self._ranks:
            process.join(max(0.0, 10.0 - waited.seconds()))
            if process.is_alive():
                process.kill()
                process.join(5.0)
        self._conns, self._ranks = [], []
