import pytest

from libra.errors import LibraError
from libra.planner.profiles import HARDWARE, MODELS, model_profile, parse_cluster

# (total, non-embedding, active) parameter counts published for these checkpoints
PUBLISHED = {
    "qwen2.5-3b": (3_085_938_688, 2_774_773_760, 3_085_938_688),
    "qwen2.5-7b": (7_615_616_512, 6_525_621_760, 7_615_616_512),
    "qwen3-4b": (4_022_468_096, 3_633_511_936, 4_022_468_096),
    "qwen3-8b": (8_190_735_360, 6_946_075_648, 8_190_735_360),
    "qwen3-14b": (14_768_307_200, 13_212_482_560, 14_768_307_200),
    "qwen3-32b": (32_762_123_264, 31_206_298_624, 32_762_123_264),
    "qwen3-30b-a3b": (30_532_122_624, 29_909_792_768, 3_353_032_704),
}
KV_KIB_PER_TOKEN = {"qwen2.5-3b": 36, "qwen2.5-7b": 56, "qwen3-4b": 144, "qwen3-8b": 144, "qwen3-14b": 160,
                    "qwen3-32b": 256, "qwen3-30b-a3b": 96}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published(name: str) -> None:
    model = MODELS[name]
    assert (model.total_params, model.non_embedding_params, model.active_params) == PUBLISHED[name]
    assert model.kv_bytes_per_token() == KV_KIB_PER_TOKEN[name] * 1024


def test_kv_heads_split_then_replicate() -> None:
    model = MODELS["qwen3-14b"]  # 8 KV heads
    assert [model.kv_bytes_per_token(tp) / 1024 for tp in (1, 2, 8, 16)] == [160, 80, 20, 20]


def test_matmul_params_exclude_input_embedding() -> None:
    assert MODELS["qwen2.5-7b"].matmul_params == 7_615_616_512 - 152064 * 3584
    assert MODELS["qwen2.5-3b"].matmul_params == 3_085_938_688  # tied head still multiplies


def test_parse_cluster() -> None:
    cluster = parse_cluster("6x8:a800")
    assert (cluster.nodes, cluster.gpus_per_node, cluster.gpus, cluster.hardware) == (6, 8, 48, HARDWARE["a800"])
    for bad, message in (("6x8", "write NODESxGPUS:HARDWARE"), ("6x8:tpu", "unknown hardware 'tpu'"),
                         ("0x8:a800", "1 <= nodes")):
        with pytest.raises(LibraError, match=message):
            parse_cluster(bad)
    with pytest.raises(LibraError, match="unknown model 'gpt-5'"):
        model_profile("gpt-5")


def test_hardware_datasheet_numbers() -> None:
    a800, h200 = HARDWARE["a800"], HARDWARE["h200"]
    assert (a800.peak_flops, a800.memory_bytes, a800.hbm_bandwidth) == (312e12, 80e9, 2039e9)
    assert a800.intra_node_bandwidth == 200e9  # 400 GB/s bidirectional NVLink
    assert (h200.peak_flops, h200.memory_bytes, h200.hbm_bandwidth) == (989e12, 141e9, 4800e9)
