"""The simulator's compiled core (`libra.native`): used only when it was built, for this interpreter,
from exactly the sources in the tree (all modules or none), and a simulation gives the same numbers
to the bit compiled or not."""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from libra import native

ROOT = Path(__file__).resolve().parents[3]


def built_as(tmp_path: Path, **changes) -> Path:
    """A build directory whose manifest matches the tree (each compiled file an empty stand-in), with
    the manifest's entries in `changes` replaced."""
    built = tmp_path / "built"
    files = {m: f"{m.replace('.', '/')}.so" for m in native.MODULES}
    for file in files.values():
        (built / file).parent.mkdir(parents=True, exist_ok=True)
        (built / file).write_bytes(b"")
    manifest = {"cache_tag": sys.implementation.cache_tag, "mypy": "2.4.0", "files": files, "slotted": [],
                "sources": {m: native.digest(native.source_of(m)) for m in native.MODULES}} | changes
    (built / native.MANIFEST).write_text(json.dumps(manifest))
    return built


def test_the_compiled_core_runs_only_when_built_from_the_sources_in_the_tree(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(native.SWITCH, raising=False)
    assert native.state(tmp_path / "none") == native.NativeState(
        False, "not built (python -m libra.native_build build)", {})
    current = native.state(built_as(tmp_path))
    assert current.active and set(current.files) == set(native.MODULES)
    edited = native.MODULES[3]
    sources = {m: native.digest(native.source_of(m)) for m in native.MODULES} | {edited: "0" * 64}
    stale = native.state(built_as(tmp_path, sources=sources))
    assert not stale.active and stale.files == {}
    assert stale.reason.startswith(f"stale: {edited} changed since the build; the Python sources run")
    other = native.state(built_as(tmp_path, cache_tag="cpython-39"))
    assert not other.active and other.reason.startswith(f"built for cpython-39, this is {sys.implementation.cache_tag}")
    for unreadable in ("{not json", "[1, 2]"):
        (tmp_path / "built" / native.MANIFEST).write_text(unreadable)
        assert native.state(tmp_path / "built").reason.startswith("its manifest is unreadable")
    built = built_as(tmp_path)
    (built / f"{native.MODULES[0].replace('.', '/')}.so").unlink()
    assert native.state(built).reason.startswith("incomplete build (missing ")
    monkeypatch.setenv(native.SWITCH, "0")
    assert native.state(built_as(tmp_path)) == native.NativeState(False, "turned off (LIBRA_NATIVE=0)", {})


SIMULATION = """
import json, sys
from libra import native
from libra.planner.cost_model import CostModel
from libra.planner.profiles import MODELS, parse_cluster
from libra.sim.modes import RolloutMode
from libra.sim.runner import simulate
from libra.sim.workloads import workload_spec
runs = simulate(workload_spec("search-r1", prompts_per_step=8), CostModel(parse_cluster("2x8:a800"), MODELS["qwen3-8b"]),
                4, ["libra", "static-uniform", "oracle"], seed=1, mode=RolloutMode(sys.argv[1]))
print(json.dumps({"compiled": native.compiled(),
                  "runs": {n: [[s.rollout_s, s.train_s, s.step_s, s.migrated_tokens] for s in r.steps] for n, r in runs.items()}}))
"""


@pytest.mark.parametrize("mode", ["sync", "partial"])
def test_compiled_and_python_simulations_agree_to_the_bit(mode: str) -> None:
    def simulated(switch: str) -> dict:
        env = dict(os.environ, **{native.SWITCH: switch})
        out = subprocess.run([sys.executable, "-c", SIMULATION, mode], cwd=ROOT, env=env, capture_output=True,
                             text=True, check=True)
        return json.loads(out.stdout)

    compiled = simulated("1")
    if not compiled["compiled"]:
        pytest.skip(f"the compiled core is not in use: {native.state().reason}")
    python = simulated("0")
    assert python["compiled"] is False
    assert compiled["runs"] == python["runs"]  # floats through JSON: exact


PICKLES = """
import pickle, sys
from libra.planner.cost_model import CostModel
from libra.planner.planner import plan
from libra.planner.profiles import MODELS, parse_cluster
from libra.scheduler.keys import KeyScheme, ToolReturn
from libra.scheduler.routers import Buckets, Lane, RouteDecision
from libra.sim.rollout import Close, InstanceSpec, Progress, path_of
from libra.sim.training import workload_of
from libra.sim.workloads import WorkloadGenerator, workload_spec
spec = workload_spec("search-r1", prompts_per_step=4)
batch = WorkloadGenerator(spec, 0).step(0)
made = plan(CostModel(parse_cluster("2x8:a800"), MODELS["qwen3-8b"]), workload_of(batch))
objects = [made.rollout, made.rollout.groups[0], workload_of(batch), workload_of(batch).buckets[0], batch[0].length,
           batch[0], batch[0].turns[0], spec, KeyScheme(), ToolReturn("search", 40, "ok"), Buckets((100, 1000)),
           Lane(2, (0.01, 0.02)), RouteDecision(1, 5.0), path_of(batch[0]), InstanceSpec(4, 1, True), Progress(1, 20, 0.5),
           Close({"t": "g"}, 1)]
if sys.argv[1] == "dump":
    sys.stdout.buffer.write(pickle.dumps(objects))
else:
    assert pickle.loads(sys.stdin.buffer.read()) == objects
    print("loaded")
"""


def test_frozen_records_pickled_by_either_core_load_in_the_other() -> None:
    """A checkpoint holds the planner's records (a plan's rollout layout and workload, among them):
    one written by the Python sources loads where the compiled core runs, and the other way round,
    equal to what was written (a compiled frozen dataclass refused the fields pickle assigns it)."""
    def run(switch: str, command: str, data: bytes = b"") -> bytes:
        env = dict(os.environ, **{native.SWITCH: switch})
        return subprocess.run([sys.executable, "-c", PICKLES, command], cwd=ROOT, env=env, input=data,
                              capture_output=True, check=True).stdout

    for writer, reader in (("0", "1"), ("1", "0"), ("1", "1")):
        assert run(reader, "load", run(writer, "dump")) == b"loaded\n", (writer, reader)
    assert pickle.loads(run("1", "dump"))  # and here, whichever core this process runs
