"""Building the simulator's compiled core (`libra.native` says what it is and when it runs).

    python -m libra.native_build build    # compile the set (needs mypy and a C compiler)
    python -m libra.native_build ensure   # compile unless current; never fails (make's set-up)
    python -m libra.native_build status   # which core runs, and why
"""

from __future__ import annotations

import argparse
import ast
import importlib.machinery
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from libra.native import BUILT, MANIFEST, MODULES, SOURCES, NativeState, digest, source_of, state

_BUILD = """
import sys
from setuptools import setup
from mypyc.build import mypycify
out, tmp, *paths = sys.argv[1:]
setup(name="libra-native", ext_modules=mypycify(paths, opt_level="3", target_dir=tmp + "/c"),
      script_args=["build_ext", "--build-lib", out, "--build-temp", tmp + "/o"])
"""


def build(built: Path = BUILT) -> NativeState:
    """Compile the set into `built` (replaced whole, only once the new build is complete)."""
    try:
        import mypy.version  # noqa: PLC0415  (a build-time tool, not needed to run)
    except ImportError as exc:
        raise SystemExit("mypy is needed to build the compiled core: pip install -e '.[native]'") from exc
    sources = {m: digest(source_of(m)) for m in MODULES}
    built.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="libra-native-", dir=built.parent) as tmp:
        out = Path(tmp) / "out"
        paths = [str(source_of(m).relative_to(SOURCES)) for m in MODULES]
        env = dict(os.environ, MYPY_CACHE_DIR=str(Path(tmp) / "cache"))
        run = subprocess.run([sys.executable, "-c", _BUILD, str(out), tmp, *paths], cwd=SOURCES, env=env,
                             capture_output=True, text=True, check=False)
        if run.returncode != 0:
            raise SystemExit("the compiled core did not build; the Python sources run instead. Its output's end:\n"
                             + "\n".join((run.stdout + run.stderr).strip().splitlines()[-15:]))
        if {m: digest(source_of(m)) for m in MODULES} != sources:
            raise SystemExit("a source changed while the compiled core was building; build again")
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        files = {}
        for file in out.rglob(f"*{suffix}"):
            name = ".".join(file.relative_to(out).with_suffix("").with_suffix("").parts)
            files[name] = str(file.relative_to(out))
        missing = [m for m in MODULES if m not in files]
        if missing:
            raise SystemExit(f"the build made no compiled file for {', '.join(missing)}")
        manifest = {"cache_tag": sys.implementation.cache_tag, "mypy": mypy.version.__version__,
                    "sources": sources, "files": files, "slotted": slotted_dataclasses()}
        (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        old = Path(tmp) / "old"
        if built.exists():
            built.rename(old)
        out.rename(built)
    return state(built)


def slotted_dataclasses() -> list[str]:
    """"module.Class" of every dataclass of the set declared with slots=True (a compiled class no
    longer says so, and Python pickles those as values in field order)."""
    found = []
    for module in MODULES:
        for node in ast.walk(ast.parse(source_of(module).read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(d, ast.Call) and getattr(d.func, "id", None) == "dataclass"
                    and any(k.arg == "slots" and isinstance(k.value, ast.Constant) and k.value.value is True
                            for k in d.keywords)
                    for d in node.decorator_list):
                found.append(f"{module}.{node.name}")
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m libra.native_build", description="Build the simulator's compiled core.")
    parser.add_argument("command", choices=("build", "ensure", "status"),
                        help="build: compile; ensure: compile unless current, never fail (make's set-up); status: say which core runs")
    args = parser.parse_args(argv)
    if args.command == "status":
        print(f"simulator core: {state().reason}")
        return 0
    if args.command == "ensure":
        now = state()
        if now.active or now.reason.startswith("turned off"):
            print(f"simulator core: {now.reason}")
            return 0
        try:
            print(f"simulator core: {build().reason}")
        except SystemExit as exc:
            print(f"note: {exc}", file=sys.stderr)
            print("simulator core: Python (the same numbers, slower)")
        return 0
    print(f"simulator core: {build().reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
