"""The GPU check's parts that run anywhere: the model it times computes what a decoder computes
(decode over a cache equals the causal prefill's last position), rows are judged as they should be,
and without a GPU it says so."""

import dataclasses

import pytest
import torch

from benchmarks.gpu_physics import Model, fits, hardware_of, main, report
from libra.planner.profiles import MODELS

TINY = dataclasses.replace(MODELS["qwen3-8b"], layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16,
                           vocab=50)


def test_decoding_over_a_cache_equals_the_causal_pass():
    model = Model(TINY, "cpu")
    model.layers = [{k: v.float() for k, v in layer.items()} for layer in model.layers]
    model.dtype = torch.float32
    x = torch.randn(3, 5, TINY.hidden, generator=torch.Generator().manual_seed(1))
    causal = model._layer(x, model.layers[0], None, None, 0)
    q_heads = TINY.kv_heads
    k_cache, v_cache = torch.zeros(3, q_heads, 5, TINY.head_dim), torch.zeros(3, q_heads, 5, TINY.head_dim)
    for position in range(5):
        out = model._layer(x[:, position:position + 1], model.layers[0], k_cache, v_cache, position)
    assert torch.allclose(out[:, 0], causal[:, -1], atol=1e-5)


def test_gpus_are_named_to_their_profiles_and_rows_that_do_not_fit_are_skipped():
    assert [hardware_of(n) for n in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A800-SXM4-80GB", "Tesla T4")] == [
        "h200", "h100", "a800", None]
    per_token = MODELS["qwen3-8b"].kv_bytes_per_token(1)  # 147,456 bytes
    assert fits(MODELS["qwen3-8b"], 256, 1024, 256 * 1024 * per_token + 2.1e9)
    assert not fits(MODELS["qwen3-8b"], 256, 1024, 256 * 1024 * per_token + 1.9e9)


def test_the_report_says_model_against_measured():
    result = {"model": "Qwen3-8B", "device": "NVIDIA H100", "hardware": "h100", "skipped": ["decode 256 x 1024: no room"],
              "decode": [{"batch": 1, "context": 1024, "measured_ms": 10.0, "model_ms": 9.0}],
              "prefill": [{"tokens": 1024, "measured_ms": 40.0, "model_ms": 50.0}]}
    assert report(result) == [
        "Qwen3-8B on NVIDIA H100 (cost model: h100, TP1, default coefficients)",
        "| step | measured ms | model ms | model / measured |", "|---|---|---|---|",
        "| decode 1 x 1,024 | 10.00 | 9.00 | 0.90 |", "| prefill 1,024 | 40.0 | 50.0 | 1.25 |",
        "skipped: decode 256 x 1024: no room", "model / measured: 0.90 to 1.25 (1 of 2 rows within 15%)"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where there is no GPU")
def test_without_a_gpu_it_says_so(capsys):
    assert main([]) == 2
    assert capsys.readouterr().err == "gpu_physics: no CUDA device here; run it on a GPU machine\n"
