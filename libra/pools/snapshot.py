"""Snapshots of weights and optimizer state as raw tensor bytes plus a JSON header, no pickling.

`write` stores a length-prefixed JSON header (the nested state with each tensor replaced by its
dtype, shape and offset) and then every tensor's bytes into a temporary file; fsync; rename. The
bytes are staged by one memory copy first (tensor copies and large file writes run without the
GIL, so a trainer thread keeps computing its forward and backward passes, which do not modify the
state, meanwhile; it only has to wait for the copy before its next optimizer step). `read` rebuilds the
state with tensors that are views of one buffer read in a single call.

File layout: 8-byte little-endian header length, UTF-8 JSON header, zero padding to 64 bytes,
then the buffer. Tensor offsets in the header are relative to the buffer and 64-byte aligned.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import torch

from libra.files import replacing

ALIGN = 64


def _walk(obj: Any, found: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        found.append(obj)
        return {"t": len(found) - 1}
    if isinstance(obj, dict):  # keys may be ints (optimizer state): keep their type
        return {"d": [[k, _walk(v, found)] for k, v in obj.items()]}
    if isinstance(obj, list | tuple):
        return {"l": [_walk(v, found) for v in obj], "tuple": isinstance(obj, tuple)}
    if obj is None or isinstance(obj, bool | int | float | str):
        return {"v": obj}
    raise TypeError(f"cannot snapshot a {type(obj).__name__}; states hold tensors, numbers, strings, lists and dicts")


def write(state: Any, path: Path, extra: dict | None = None, copied: threading.Event | None = None,
          durable: bool = True) -> int:
    """Atomically write `state` (and JSON-able `extra`) to `path`; returns the file size. With
    `durable` the file is fsynced before it is renamed into place (a join snapshot needs not be:
    it only has to outlive the join, not a power loss).

    The tensors' bytes are first copied into one staging buffer (a memory copy, without the GIL);
    `copied` is set then, so a trainer may modify its state again while the buffer goes to disk."""
    try:
        found: list[torch.Tensor] = []
        skeleton = _walk(state, found)
        specs, offset = [], 0
        for t in found:
            size = t.numel() * t.element_size()
            specs.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "offset": offset,
                          "bytes": size})
            offset += -(-size // ALIGN) * ALIGN
        header = json.dumps({"skeleton": skeleton, "tensors": specs, "extra": extra or {}}).encode()
        staged = torch.empty(offset, dtype=torch.uint8)  # one memory copy, then the state is free again
        for t, spec in zip(found, specs, strict=True):
            if spec["bytes"]:
                staged[spec["offset"]:spec["offset"] + spec["bytes"]].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
        if copied is not None:
            copied.set()
        with replacing(path, durable=durable) as f:
            f.write(len(header).to_bytes(8, "little"))
            f.write(header)
            f.write(b"\0" * (-(8 + len(header)) % ALIGN))
            f.write(memoryview(staged.numpy()))
    finally:
        if copied is not None:
            copied.set()
    return path.stat().st_size


def read(path: Path) -> tuple[Any, dict]:
    """(state, extra) from a file `write` produced."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        f.seek(-(8 + size) % ALIGN, os.SEEK_CUR)
        total = sum(-(-t["bytes"] // ALIGN) * ALIGN for t in header["tensors"])
        buffer = torch.empty(total, dtype=torch.uint8)
        if f.readinto(memoryview(buffer.numpy())) != total:
            raise ValueError(f"snapshot {path} is truncated")
    tensors = [buffer[t["offset"]:t["offset"] + t["bytes"]].view(getattr(torch, t["dtype"])).reshape(t["shape"])
               for t in header["tensors"]]
    return _build(header["skeleton"], tensors), header["extra"]


def _build(node: dict, tensors: list[torch.Tensor]) -> Any:
    if "t" in node:
        return tensors[node["t"]]
    if "d" in node:
        return {k: _build(v, tensors) for k, v in node["d"]}
    if "l" in node:
        items = [_build(v, tensors) for v in node["l"]]
        return tuple(items) if node["tuple"] else items
    return node["v"]
