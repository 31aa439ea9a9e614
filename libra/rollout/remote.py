"""A rollout engine in a Ray actor, on the host a plan put it on, behind the `Engine` protocol.

    engine = RemoteEngine("vllm", policy_dir, size=2, cores=(0, 1), strategy=bundle)   # the actor starts it
    engine.submit(...); engine.poll(); engine.update_weights(directory); engine.close()

The actor makes the engine with `engines.make_engine` on its cores (pinned) of its host, so an
engine is the same object on a cluster as on one machine; the agent loop, the router and the weight
sync drive it through the same calls, each a round trip to the actor. Requests are sent without
waiting (an actor runs its calls in the order sent); `has_work` counts requests not yet returned.
Weights are loaded from a directory every host can read (the run's checkpoint directory: a cluster
shares one file system for checkpoints, the store and the trainer's files).

An actor that dies (its process, or its host) surfaces as `HostLostError` naming the engine's host,
which the training flow answers by re-planning on the hosts that are left.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from libra.errors import HostLostError
from libra.rollout.engines import DecodeTiming, Generation


class RemoteTimer:
    """The remote engine's decode timer: `drain` fetches what its engine timed."""

    def __init__(self, engine: RemoteEngine) -> None:
        self.engine = engine

    def drain(self) -> list[DecodeTiming]:
        return self.engine._call("drain_timer")


class RemoteEngine:
    def __init__(self, kind: str, model_dir: str | Path, size: int, cores: Sequence[int] | None = None,
                 gpus: Sequence[int] | None = None, max_context: int = 2048, *, host: str = "",
                 strategy: Any = None, cpus: float = 0.0) -> None:
        """`cores`/`gpus`: the engine's on its host; `host`: that host's address (for messages);
        `strategy`: where Ray runs the actor (a placement group's bundle); `cpus`: the CPUs it holds."""
        import ray

        self.ray = ray
        self.host = host
        self.size = size
        options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": len(gpus) if gpus else 0, "max_restarts": 0}
        if strategy is not None:
            options["scheduling_strategy"] = strategy
        self.actor = _EngineActor().options(**options).remote(  # type: ignore[attr-defined]
            kind, str(model_dir), size, tuple(cores) if cores else None, tuple(gpus) if gpus else None, max_context)
        self.name = self._call("name")  # waits for the engine to start
        self.timer = RemoteTimer(self)
        self.pending = 0

    def _call(self, method: str, *args: Any) -> Any:
        from ray.exceptions import RayActorError

        try:
            return self.ray.get(getattr(self.actor, method).remote(*args))
        except RayActorError as exc:
            raise HostLostError(self.host, f"the rollout engine on host {self.host or '?'} is gone ({type(exc).__name__})") \
                from None

    def submit(self, request_id: str, prompt: list[int], max_tokens: int, stop: Sequence[str],
               temperature: float, seed: int = 0, min_tokens: int = 0) -> None:
        self.actor.submit.remote(request_id, list(prompt), max_tokens, list(stop), temperature, seed, min_tokens)
        self.pending += 1

    def poll(self) -> list[tuple[str, Generation]]:
        finished = self._call("poll")
        self.pending -= len(finished)
        return finished

    def has_work(self) -> bool:
        return self.pending > 0

    def abort_all(self) -> list[tuple[str, Generation]]:
        aborted = self._call("abort_all")  # after every submit sent before it (an actor's calls run in order)
        self.pending = 0
        return aborted

    def generate(self, prompts: Sequence[list[int]], max_tokens: int, stop: Sequence[str], temperature: float,
                 seed: int) -> list[Generation]:
        return self._call("generate", [list(p) for p in prompts], max_tokens, list(stop), temperature, seed)

    def sequence_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        return self._call("sequence_logprobs", list(token_ids))

    def update_weights(self, checkpoint: str | Path) -> float:
        return self._call("update_weights", str(checkpoint))

    def update_state_dict(self, state: dict) -> float:
        return self._call("update_state_dict", state)

    def close(self) -> None:
        try:
            self.ray.get(self.actor.close.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - gone already (its host died): nothing to close
            pass
        self.ray.kill(self.actor)


def _EngineActor():  # noqa: N802 - builds the Ray actor class lazily, so importing this module needs no Ray
    import ray

    @ray.remote
    class EngineActor:
        def __init__(self, kind: str, model_dir: str, size: int, cores: tuple[int, ...] | None,
                     gpus: tuple[int, ...] | None, max_context: int) -> None:
            from libra.rollout.engines import make_engine, pin_process

            os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
            if cores:
                pin_process(cores)  # this actor's process (transformers) and what it starts (vLLM's)
                import torch

                torch.set_num_threads(len(cores))
            self.engine = make_engine(kind, model_dir, size, cores, gpus, max_context)

        def name(self) -> str:
            return self.engine.name

        def submit(self, *request: Any) -> None:
            request_id, prompt, max_tokens, stop, temperature, seed, min_tokens = request
            self.engine.submit(request_id, prompt, max_tokens, stop, temperature, seed=seed, min_tokens=min_tokens)

        def poll(self) -> list[tuple[str, Generation]]:
            return self.engine.poll() if self.engine.has_work() else []

        def abort_all(self) -> list[tuple[str, Generation]]:
            return self.engine.abort_all()

        def generate(self, *args: Any) -> list[Generation]:
            return self.engine.generate(*args)

        def sequence_logprobs(self, token_ids: list[int]) -> list[float]:
            return self.engine.sequence_logprobs(token_ids)

        def update_weights(self, checkpoint: str) -> float:
            return self.engine.update_weights(checkpoint)

        def update_state_dict(self, state: dict) -> float:
            return self.engine.update_state_dict(state)

        def drain_timer(self) -> list[DecodeTiming]:
            return self.engine.timer.drain()

        def close(self) -> None:
            self.engine.close()

    return EngineActor
