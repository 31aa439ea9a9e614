"""The simulator's compiled core: the event loop and its clock, the rollout physics, the routers' decisions and
the rollout search compiled with mypyc from their own Python sources, and used only when it was
built from exactly the sources in the tree.

    python -m libra.native_build build    # compile them (`make setup` does; needs a C compiler and mypy)
    python -m libra.native_build status   # which core runs, and why

The compiled modules run the Python modules' own operations in the same order, so a simulation
gives the same numbers to the bit either way (`tests/libra/sim/test_native.py` checks it; the
pinned simulator tests hold both ways). It is all or none: compiled modules call one another in
C, so a single edited source (its hash no longer the one built) turns the whole set off, and the
Python sources run until the next build. `LIBRA_NATIVE=0` turns it off too.

Where it runs, a compiled class cannot be patched from Python or subclassed by a Python class:
patch the module that uses it instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from libra.errors import LibraError
from libra.switches import switch

# the hot path of a simulation at cluster scale, in import order
MODULES = (
    "libra.clock",
    "libra.planner.workload",
    "libra.sim.workloads",
    "libra.sim.engine",
    "libra.scheduler.keys",
    "libra.scheduler.causal_tree",
    "libra.scheduler.lengths",
    "libra.scheduler.routers",
    "libra.scheduler.libra_router",
    "libra.planner.rollout_search",
    "libra.sim.rollout",
)
PACKAGE = Path(__file__).resolve().parent  # libra/
SOURCES = PACKAGE.parent  # where `libra` is importable from
BUILT = PACKAGE / "_native"  # the compiled modules and their manifest (not in git)
MANIFEST = "manifest.json"
SWITCH = "LIBRA_NATIVE"  # "0" turns the compiled core off


@dataclass(frozen=True)
class NativeState:
    """Whether the compiled core runs, and why (or why not)."""

    active: bool
    reason: str
    files: dict[str, Path]  # module name -> its compiled file (empty when inactive)
    slotted: frozenset[str] = frozenset()  # "module.Class" of the dataclasses declared with slots=True


def source_of(module: str) -> Path:
    return SOURCES.joinpath(*module.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def state(built: Path = BUILT) -> NativeState:
    """What `install` would do: active only if every module was compiled, for this interpreter,
    from the source now in the tree."""
    try:
        on = switch(SWITCH, True)
    except LibraError as exc:
        return NativeState(False, f"{exc}; the Python sources run", {})
    if not on:
        return NativeState(False, f"turned off ({SWITCH}={os.environ[SWITCH]})", {})
    try:
        manifest = json.loads((built / MANIFEST).read_text())
    except FileNotFoundError:
        return NativeState(False, "not built (python -m libra.native_build build)", {})
    except (OSError, ValueError) as exc:
        return NativeState(False, f"its manifest is unreadable ({exc}); rebuild: python -m libra.native_build build", {})
    if not isinstance(manifest, dict):
        return NativeState(False, "its manifest is unreadable (not a JSON object); rebuild: python -m libra.native_build build", {})
    if manifest.get("cache_tag") != sys.implementation.cache_tag:
        return NativeState(False, f"built for {manifest.get('cache_tag')}, this is {sys.implementation.cache_tag}; "
                                  "rebuild: python -m libra.native_build build", {})
    sources = manifest.get("sources", {})
    try:
        stale = [m for m in MODULES if sources.get(m) != digest(source_of(m))]
    except OSError as exc:  # (a process that sees the package but not its sources)
        return NativeState(False, f"its sources are unreadable here ({exc}): not used", {})
    if stale:
        return NativeState(False, f"stale: {', '.join(stale)} changed since the build; the Python sources run "
                                  "(rebuild: python -m libra.native_build build)", {})
    files = {name: built / file for name, file in manifest.get("files", {}).items()}
    missing = [str(f) for f in files.values() if not f.is_file()] or [m for m in MODULES if m not in files]
    if missing:
        return NativeState(False, f"incomplete build (missing {', '.join(missing)}); rebuild: python -m libra.native_build build", {})
    slotted = manifest.get("slotted")
    if not isinstance(slotted, list):
        return NativeState(False, "a build from an older Libra; rebuild: python -m libra.native_build build", {})
    return NativeState(True, f"compiled ({len(MODULES)} modules, mypy {manifest.get('mypy')})", files, frozenset(slotted))


def _set_frozen_state(self: object, state: object) -> None:
    """Unpickling a compiled frozen dataclass: its fields set as its `__init__` sets them (pickle
    would assign each one, which a frozen class refuses). `state` as any pickle of it holds it: the
    fields by name, (dict, slots) as for classes with slots, or the values in field order."""
    if isinstance(state, tuple) and len(state) == 2 and all(part is None or isinstance(part, dict) for part in state):
        state = {**(state[0] or {}), **(state[1] or {})}
    if isinstance(state, (list, tuple)):
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        state = {f.name: value for f, value in zip(fields, state, strict=True)}
    if not isinstance(state, dict):
        raise TypeError(f"cannot restore a {type(self).__name__} from {type(state).__name__}")
    for name, value in state.items():
        object.__setattr__(self, name, value)


def _frozen_values(self: object) -> list[object]:
    """Pickling a compiled dataclass declared with slots=True: its values in field order, as Python
    pickles such a class (so that either core loads what the other wrote)."""
    return [getattr(self, f.name) for f in dataclasses.fields(self)]  # type: ignore[arg-type]


class _CompiledLoader(importlib.machinery.ExtensionFileLoader):
    """Loads a compiled module; its frozen dataclasses then pickle as the Python ones do, both ways
    (checkpoints hold the planner's records): mypyc's own __setstate__ assigns each field, which a
    frozen class refuses, and its __getstate__ gives fields by name where a class with slots gives
    values in order."""

    def __init__(self, fullname: str, path: str, slotted: frozenset[str]) -> None:
        super().__init__(fullname, path)
        self.slotted = slotted

    def exec_module(self, module: ModuleType) -> None:
        super().exec_module(module)
        for name in MODULES:  # every one loaded by now: a module's initialisation may load others of its group
            loaded = sys.modules.get(name)
            for value in list(vars(loaded).values()) if loaded is not None else []:
                params = getattr(value, "__dataclass_params__", None)
                if isinstance(value, type) and value.__module__ == name and params is not None and params.frozen:
                    type.__setattr__(value, "__setstate__", _set_frozen_state)
                    if f"{name}.{value.__name__}" in self.slotted:
                        type.__setattr__(value, "__getstate__", _frozen_values)


class _CompiledFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled file of each module of the set (and of their shared library)."""

    def __init__(self, files: dict[str, Path], slotted: frozenset[str]) -> None:
        self.files = files
        self.slotted = slotted

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        return importlib.util.spec_from_file_location(fullname, file, loader=_CompiledLoader(fullname, str(file), self.slotted))


_installed: NativeState | None = None


def install() -> NativeState:
    """Put the compiled core first on the import path, if it is current (once per process); before
    any module of the set is imported, or it stays Python in this process."""
    global _installed
    if _installed is None:
        _installed = state()
        already = [m for m in MODULES if m in sys.modules]
        if _installed.active and already:
            _installed = NativeState(False, f"{', '.join(already)} imported before the compiled core was installed", {})
        if _installed.active:
            sys.meta_path.insert(0, _CompiledFinder(_installed.files, _installed.slotted))
    return _installed


def compiled() -> bool:
    """Whether this process runs the compiled core: every module of the set imported, each from its
    compiled file."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return all(str(getattr(sys.modules.get(m), "__file__", "")).endswith(suffixes) for m in MODULES)
