"""The pool's control plane: small JSON messages on a torch.distributed `TCPStore`.

The store is hosted by the coordinating process, so it outlives any worker. Three kinds of keys:

- channels (append-only message logs): `requests` (to the leader: join, leave, ready, loaded,
  exited, died) and `events` (pool events from the leader to the coordinator); writers take the
  next index with an atomic `add`, readers keep their own offset;
- inboxes, one per hybrid: `inbox/<id>/<k>` (snapshot to load, generation to enter, cancel, stop);
- step boundaries: `step/<s>` names the replica generation that runs step s (-1: training is over),
  `gen/<g>` lists that generation's members in rank order and which of them are active.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from libra.clock import Clock, Deadline, WallClock, sleep

DONE = -1  # `step/<s>` value once the run has no step s


class Control:
    """A client of the pool's store; its waits run on `clock` (monotonic wall time unless another is
    injected)."""

    def __init__(self, store: dist.Store, clock: Clock | None = None) -> None:
        self.store = store
        self.clock = clock or WallClock()

    @staticmethod
    def connect(host: str, port: int, timeout_s: float = 300.0, clock: Clock | None = None) -> Control:
        return Control(dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s)), clock)

    # -- plain keys ---------------------------------------------------------------------------
    def put(self, key: str, value: Any) -> None:
        self.store.set(key, json.dumps(value))

    def put_many(self, items: dict[str, Any]) -> None:
        """Several keys in one round trip."""
        self.store.multi_set(list(items), [json.dumps(v) for v in items.values()])

    def get(self, key: str) -> Any:
        """Blocks until the key exists (up to the store's timeout)."""
        return json.loads(self.store.get(key))

    def has(self, key: str) -> bool:
        return self.store.check([key])

    def wait(self, key: str, timeout_s: float, poll_s: float = 0.01) -> bool:
        """Whether `key` appeared within `timeout_s` (polled: the store's own timed wait logs a warning
        on every expiry)."""
        deadline = Deadline(self.clock, timeout_s)
        while not self.store.check([key]):
            if deadline.left() <= 0:
                return False
            sleep(self.clock, poll_s)
        return True

    # -- channels -------------------------------------------------------------------------------
    def post(self, channel: str, message: dict) -> None:
        index = self.store.add(f"{channel}/n", 1)
        self.store.set(f"{channel}/{index}", json.dumps(message))

    def read(self, channel: str, offset: int) -> tuple[list[dict], int]:
        """Messages after `offset` and the new offset."""
        last = self.store.add(f"{channel}/n", 0)
        return [self.get(f"{channel}/{i}") for i in range(offset + 1, last + 1)], last

    # -- inboxes --------------------------------------------------------------------------------
    def send(self, worker: str, message: dict) -> None:
        index = self.store.add(f"inbox/{worker}/n", 1)
        self.store.set(f"inbox/{worker}/{index}", json.dumps(message))

    def inbox_offset(self, worker: str) -> int:
        return self.store.add(f"inbox/{worker}/n", 0)

    def receive(self, worker: str, offset: int, timeout_s: float) -> dict | None:
        key = f"inbox/{worker}/{offset + 1}"
        return self.get(key) if self.wait(key, timeout_s) else None
