import json
import os
from dataclasses import asdict, replace
from pathlib import Path

import pyarrow as pa
import pytest

from cli.main import main
from libra.planner.calibrate import TimingSample, predict
from libra.planner.cost_model import Coefficients, CostModel
from libra.planner.profiles import MODELS, parse_cluster
from storage.writer import StoreWriter

ROOT = Path(__file__).resolve().parents[2]
SWE = ROOT / "data" / "traces" / "swe_gemini3_mini_A.csv"


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_from_trace_json(capsys) -> None:
    code, out, _ = run_cli(capsys, "plan", "--cluster", "6x8:a800", "--model", "qwen3-14b", "--trace", str(SWE), "--json")
    assert code == 0
    plan = json.loads(out)
    assert set(plan["train"]) >= {"gpus", "tp", "pp", "dp", "ep", "micro_batch"}
    assert set(plan["rollout"]) == {"gpus", "instances"}
    assert all(set(i) >= {"tp", "count", "max_tokens"} for i in plan["rollout"]["instances"])
    assert {"t_train_s", "t_rollout_s", "t_iter_s", "search_ms"} <= set(plan)
    t = plan["train"]
    assert t["tp"] * t["pp"] * t["dp"] <= t["gpus"]
    gpus = t["gpus"] + plan["rollout"]["gpus"] + plan["hybrid"]["gpus"]
    assert gpus == 48
    assert sum(i["tp"] * i["count"] for i in plan["rollout"]["instances"]) <= plan["rollout"]["gpus"]
    assert plan["rollout"]["instances"][-1]["max_tokens"] == 86224  # the longest SWE trajectory
    assert plan["t_iter_s"] >= max(plan["t_train_s"], plan["t_rollout_s"])


def test_plan_from_run_text_and_errors(tmp_path: Path, capsys) -> None:
    store = str(tmp_path / "store")
    run_cli(capsys, "traces", "import", str(SWE), "--run", "swe", "--store", store)
    code, out, _ = run_cli(capsys, "plan", "--cluster", "6x8:a800", "--model", "qwen3-14b", "--run", "swe", "--store", store)
    assert code == 0 and out.startswith("plan for 6x8:A800-SXM4-80GB (48 GPUs), Qwen3-14B, one_step_off")
    assert "T_iter" in out
    code, _, err = run_cli(capsys, "plan", "--cluster", "1x8:a800", "--model", "qwen3-32b", "--run", "swe", "--store", store)
    assert code == 2 and err.startswith("libra: error: no training configuration of Qwen3-32B fits")
    code, _, err = run_cli(capsys, "plan", "--cluster", "6x8:tpu", "--model", "qwen3-14b", "--run", "swe", "--store", store)
    assert code == 2 and "unknown hardware 'tpu'" in err
    code, _, err = run_cli(capsys, "plan", "--cluster", "6x8:a800", "--model", "qwen3-14b", "--run", "swe",
                           "--store", store, "--calibrate")
    assert code == 2 and "has no timing samples" in err


def test_plan_calibrates_from_run_timings(tmp_path: Path, capsys) -> None:
    store = tmp_path / "store"
    run_cli(capsys, "traces", "import", str(SWE), "--run", "swe", "--store", str(store))
    default = CostModel(parse_cluster("6x8:a800"), MODELS["qwen3-14b"])
    truth = replace(default, coefficients=replace(Coefficients(), decode_memory=1.6, train_compute=3.0))
    samples = [TimingSample("decode_step", 0.0, tp=tp, batch=b, context_tokens=ctx)
               for tp in (1, 2, 4) for b in (1, 16, 64) for ctx in (1000, 8000)]
    samples += [TimingSample("train_step", 0.0, tp=4, pp=1, dp=d, micro_batch=1, sequences=s, tokens=s * 4000.0,
                             max_tokens=8000) for d in (1, 2, 4) for s in (64, 256)]
    rows = [{**asdict(replace(s, seconds=predict(truth, s))), "step": 0} for s in samples]
    StoreWriter(store, fsync=False).write_step("timings", "swe", 0, pa.Table.from_pylist(rows))
    code, out, _ = run_cli(capsys, "plan", "--cluster", "6x8:a800", "--model", "qwen3-14b", "--run", "swe",
                           "--store", str(store), "--calibrate", "--json")
    assert code == 0
    calibration = json.loads(out)["calibration"]
    assert calibration["samples"] == {"train_step": 6, "decode_step": 18, "prefill": 0}
    assert calibration["coefficients"]["decode_memory"] == pytest.approx(1.6, rel=1e-6)
    assert calibration["coefficients"]["train_compute"] == pytest.approx(3.0, rel=1e-6)


def test_eval_router_json(capsys) -> None:
    trace = ROOT / "data" / "traces" / "taubench_airline.csv"
    code, out, _ = run_cli(capsys, "eval-router", "--trace", str(trace), "--buckets", "2000,4000",
                           "--routers", "libra,cmlfq,oracle,always-shortest", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["buckets"] == [2000, 4000]
    assert list(report["policies"]) == ["libra", "cmlfq", "oracle", "always-shortest"]
    for metrics in report["policies"].values():
        assert set(metrics) == {"accuracy", "balanced_accuracy", "rank_correlation", "migrated_token_ratio",
                                "decisions", "p50_us", "p99_us"}
    assert report["policies"]["oracle"]["accuracy"] == 1.0
    assert report["policies"]["always-shortest"]["migrated_token_ratio"] == 0.0
    assert report["policies"]["always-shortest"]["rank_correlation"] is None
    assert report["policies"]["libra"]["migrated_token_ratio"] <= 0.082
    bound = report["bound"]
    assert bound["budget"] == 0.07 and bound["migrated_token_ratio"] <= 0.07
    assert bound["achieved"] <= bound["balanced_accuracy"] <= 1.0
    code, out, _ = run_cli(capsys, "eval-router", "--trace", str(trace))
    assert code == 0 and "router" in out.splitlines()[1] and "libra" in out and "cmlfq@budget" in out
    assert "clairvoyant bound within a 7.0% migration budget" in out
    code, _, err = run_cli(capsys, "eval-router", "--trace", str(trace), "--buckets", "x")
    assert code == 2 and "--buckets 'x'" in err


def test_tree_rebuild_from_store(tmp_path: Path, capsys) -> None:
    from libra.scheduler.causal_tree import GLOBAL, CausalTree

    store = str(tmp_path / "store")
    run_cli(capsys, "traces", "import", str(SWE), "--run", "swe", "--store", store)
    out_file = tmp_path / "tree.json"
    code, out, _ = run_cli(capsys, "tree", "--run", "swe", "--store", store, "--out", str(out_file), "--json")
    summary = json.loads(out)
    assert code == 0 and (summary["trajectories"], summary["tool_returns"]) == (246, 9976)
    tree = CausalTree.load(out_file)
    assert tree.nodes == summary["nodes"] and tree.roots[GLOBAL].count == 246
    code, out, _ = run_cli(capsys, "tree", "--run", "swe", "--store", store, "--out", str(out_file), "--last-steps", "5", "--json")
    assert json.loads(out)["trajectories"] == 38
    code, _, err = run_cli(capsys, "tree", "--run", "swe", "--store", store, "--out", str(tmp_path / "no" / "t.json"))
    assert code == 2 and "cannot write" in err
    # a tree replaces a tree (above), never what else is there: a trace, a store's manifest, a FIFO, a link
    fifo, link, trace = tmp_path / "fifo", tmp_path / "link.json", tmp_path / "trace.csv"
    os.mkfifo(fifo)
    trace.write_bytes(SWE.read_bytes())
    link.symlink_to(out_file)
    manifest = Path(store) / "_runs" / "swe.manifest"
    kept = {p: p.read_bytes() for p in (trace, manifest)}
    for target in (trace, manifest, fifo, link, tmp_path):
        code, _, err = run_cli(capsys, "tree", "--run", "swe", "--store", store, "--out", str(target))
        assert code == 2 and err.strip() == (f"libra: error: --out {target} exists and is not a causal tree file (a "
                                             "file of another kind, a directory, a device, a FIFO or a link); remove it "
                                             "or name another --out"), err
    assert {p: p.read_bytes() for p in kept} == kept and fifo.is_fifo() and link.is_symlink()
    code, _, err = run_cli(capsys, "tree", "--run", "swe", "--store", store, "--out", "")
    assert code == 2 and err.strip() == "libra: error: --out '' does not name a file; give FILE.json"
