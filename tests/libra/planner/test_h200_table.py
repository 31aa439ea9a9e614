"""The cost model's prefill and decode against one H200's measured steps (`data/gpu/`): the table
pinned, every row within 15% of the model's defaults, and the defaults what `calibrate.fit` finds
in the table."""

import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from libra.planner.calibrate import TimingSample, fit, predict
from libra.planner.cost_model import Coefficients, CostModel
from libra.planner.profiles import MODELS, parse_cluster

TABLE = Path(__file__).resolve().parents[3] / "data" / "gpu" / "h200_qwen3_14b_tp1.json"
H200 = CostModel(parse_cluster("1x8:h200"), MODELS["qwen3-14b"])


def samples() -> list[TimingSample]:
    table = json.loads(TABLE.read_text())
    return ([TimingSample("decode_step", r["ms"] / 1e3, tp=1, batch=r["batch"], context_tokens=r["context"])
             for r in table["decode"]]
            + [TimingSample("prefill", r["ms"] / 1e3, tp=1, tokens=r["tokens"], context_tokens=r["tokens"] / 2)
               for r in table["prefill"]])


def test_the_table_is_the_measured_one():
    assert hashlib.sha256(TABLE.read_bytes()).hexdigest() == "19b9dad62633616d605ee0d6ba7c4cadecc09abf9c81406af2ef2e63cc741dda"
    table = json.loads(TABLE.read_text())
    assert (table["device"], len(table["decode"]), len(table["prefill"])) == ("NVIDIA H200", 12, 3)
    assert table["weight_bytes"] == pytest.approx(MODELS["qwen3-14b"].weight_bytes, rel=1e-5)  # the same model


def test_every_row_is_within_15_percent_of_the_model():
    ratios = {(s.kind, s.batch, s.context_tokens, s.tokens): predict(H200, s) / s.seconds for s in samples()}
    assert all(0.85 <= r <= 1.15 for r in ratios.values()), ratios
    # the rows the overlapped roofline missed most: a full batch at 1K (0.56) and a lone 131K sequence (0.68)
    assert ratios[("decode_step", 512, 1024, 0.0)] == pytest.approx(1.001, abs=0.002)
    assert ratios[("decode_step", 1, 131072, 0.0)] == pytest.approx(1.008, abs=0.002)
    assert max(abs(r - 1) for r in ratios.values()) == pytest.approx(0.051, abs=0.001)  # the 1K prefill


def test_the_fit_of_the_table_recovers_the_default_coefficients():
    """From the coefficients of the overlapped roofline (published efficiencies), the fit lands on
    the defaults; the weights' read is held at its measured ceiling (one TP cannot tell it from
    the fixed cost)."""
    before = replace(H200, coefficients=replace(Coefficients(), prefill_compute=1 / 0.55, decode_compute=1 / 0.55,
                                                decode_kv=1 / 0.85, decode_kv_tail=0.0, decode_step_s=0.0005,
                                                decode_seq_s=0.0))
    found, defaults = asdict(fit(before, samples()).coefficients), asdict(Coefficients())
    assert all(found[k] == pytest.approx(defaults[k], rel=0.005) for k in defaults), (found, defaults)
    assert Coefficients().decode_memory == pytest.approx(4.8 / 4.1948, rel=1e-4)
