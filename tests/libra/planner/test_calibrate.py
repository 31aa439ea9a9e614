import random
from dataclasses import replace

from libra.planner.calibrate import TimingSample, fit, mean_abs_rel_error, predict
from libra.planner.cost_model import Coefficients, CostModel
from libra.planner.profiles import MODELS, parse_cluster

TRUTH = Coefficients(train_compute=3.1, train_comm=2.2, train_step_s=4.0, prefill_compute=2.6,
                     decode_compute=2.4, decode_memory=1.5, decode_kv=1.7, decode_kv_tail=0.4, rollout_comm=1.9,
                     decode_step_s=0.006, decode_seq_s=0.0)


def _samples(truth: CostModel, n: int, rng: random.Random, noise: float = 0.03) -> list[TimingSample]:
    out = []
    for _ in range(n):
        kind = rng.choice(["train_step", "decode_step", "prefill"])
        if kind == "train_step":
            length = rng.randint(1_000, 16_000)
            sequences = rng.choice([64, 128, 256, 512])
            sample = TimingSample(kind, 0.0, tp=rng.choice([1, 2, 4, 8]), pp=rng.choice([1, 2, 4]),
                                  dp=rng.choice([1, 2, 4]), micro_batch=rng.choice([1, 2]), sequences=sequences,
                                  tokens=sequences * length * 0.7, max_tokens=length)
        elif kind == "prefill":
            sample = TimingSample(kind, 0.0, tp=rng.choice([1, 2, 4]), tokens=rng.randint(100, 20_000),
                                  context_tokens=rng.randint(100, 20_000))
        else:
            sample = TimingSample(kind, 0.0, tp=rng.choice([1, 2, 4, 8]), batch=rng.randint(1, 256),
                                  context_tokens=rng.randint(100, 30_000))
        out.append(replace(sample, seconds=predict(truth, sample) * (1 + rng.gauss(0, noise))))
    return out


def test_fit_recovers_coefficients_within_ten_percent_on_held_out() -> None:
    rng = random.Random(7)
    default = CostModel(parse_cluster("2x8:h100"), MODELS["qwen3-8b"])
    truth = replace(default, coefficients=TRUTH)
    train, held_out = _samples(truth, 300, rng), _samples(truth, 150, rng)
    result = fit(default, train)
    fitted = replace(default, coefficients=result.coefficients)
    for kind in ("train_step", "decode_step", "prefill"):
        group = [s for s in held_out if s.kind == kind]
        worst = max(abs(predict(fitted, s) - s.seconds) / s.seconds for s in group)
        assert worst < 0.10, (kind, worst)
        assert mean_abs_rel_error(default, group) > 0.15  # the defaults were really off
    c = result.coefficients
    assert abs(c.train_compute - 3.1) / 3.1 < 0.05
    assert abs(c.prefill_compute - 2.6) / 2.6 < 0.05
    assert abs(c.decode_memory - 1.5) / 1.5 < 0.05
    assert result.samples == {k: sum(s.kind == k for s in train) for k in ("train_step", "decode_step", "prefill")}


def test_too_few_samples_keep_defaults() -> None:
    default = CostModel(parse_cluster("1x8:a800"), MODELS["qwen3-4b"])
    sample = TimingSample("prefill", 1.0, tp=1, tokens=1000, context_tokens=500)
    assert fit(default, [sample]).coefficients == default.coefficients


def test_invalid_and_underdetermined_samples_are_refused() -> None:
    default = CostModel(parse_cluster("1x8:a800"), MODELS["qwen3-4b"])
    bad = [
        TimingSample("train_step", 10.0, tp=1, sequences=0, tokens=1000, max_tokens=100),  # no sequences
        TimingSample("prefill", float("inf"), tp=1, tokens=1000, context_tokens=10),
        TimingSample("prefill", 0.0, tp=1, tokens=1000, context_tokens=10),
        TimingSample("decode_step", 0.01, tp=1, batch=0, context_tokens=10),
    ]
    same_config = [TimingSample("train_step", 100.0 + i, tp=2, pp=1, dp=2, micro_batch=1, sequences=64,
                                tokens=64 * 4000, max_tokens=4000) for i in range(5)]
    result = fit(default, bad + same_config)
    assert result.rejected == 4
    assert result.kept_defaults == ("train_step",)  # five samples of one configuration cannot separate 3 terms
    assert result.coefficients == default.coefficients


HOST = Coefficients(decode_compute=2.0, decode_memory=1.3, rollout_comm=1.6, decode_step_s=0.004, decode_seq_s=4e-5)


def _decode_samples(truth: CostModel, tps: tuple[int, ...], n: int, rng: random.Random) -> list[TimingSample]:
    out = []
    for _ in range(n):
        sample = TimingSample("decode_step", 0.0, tp=rng.choice(tps), batch=rng.randint(1, 256),
                              context_tokens=rng.randint(100, 8_000))
        out.append(replace(sample, seconds=predict(truth, sample) * (1 + rng.gauss(0, 0.02))))
    return out


def test_host_cost_per_sequence_is_told_apart_from_the_device_by_two_instance_sizes() -> None:
    """A per-sequence host cost that no instance size shrinks is recovered with the device's terms
    when two sizes were measured."""
    default = CostModel(parse_cluster("1x8:a800"), MODELS["qwen3-4b"])
    truth = replace(default, coefficients=HOST)
    result = fit(default, _decode_samples(truth, (1, 2), 200, random.Random(3)))
    c = result.coefficients
    assert abs(c.decode_seq_s - 4e-5) / 4e-5 < 0.05
    assert abs(c.decode_memory - 1.3) / 1.3 < 0.05
    assert result.mean_abs_rel_error["decode_step"] < 0.03
    assert result.set_aside == 0


def test_one_instance_size_keeps_the_terms_that_do_not_vary_within_it() -> None:
    """Samples of one size cannot tell the weights' read and the all-reduces (the same at every
    batch) from the fixed cost: those keep their values; the terms that vary with the batch and the
    context are fitted, the per-sequence host cost among them, and the size's steps are predicted."""
    default = CostModel(parse_cluster("1x8:a800"), MODELS["qwen3-4b"])
    truth = replace(default, coefficients=HOST)
    result = fit(default, _decode_samples(truth, (1,), 200, random.Random(4)))
    c, d = result.coefficients, default.coefficients
    assert (c.decode_memory, c.rollout_comm) == (d.decode_memory, d.rollout_comm)
    assert abs(c.decode_seq_s - 4e-5) / 4e-5 < 0.05
    fitted = replace(default, coefficients=c)
    held_out = _decode_samples(truth, (1,), 100, random.Random(40))
    assert max(abs(predict(fitted, s) - predict(truth, s)) / predict(truth, s) for s in held_out) < 0.03


def test_near_empty_engine_steps_are_set_aside() -> None:
    """Eight of 200 samples at a tenth of their time (steps that returned before the batch ran) would
    drag a fit on relative error down; they are set aside and the coefficients still recovered."""
    default = CostModel(parse_cluster("1x8:a800"), MODELS["qwen3-4b"])
    truth = replace(default, coefficients=HOST)
    samples = _decode_samples(truth, (1, 2), 200, random.Random(5))
    samples[:8] = [replace(s, seconds=s.seconds / 10) for s in samples[:8]]
    result = fit(default, samples)
    assert result.set_aside == 8
    assert result.samples["decode_step"] == 192
    assert abs(result.coefficients.decode_seq_s - 4e-5) / 4e-5 < 0.05
    assert result.mean_abs_rel_error["decode_step"] < 0.03


def test_decisions_wait_while_a_kind_still_has_its_default_coefficients() -> None:
    from libra.planner.calibrate import calibration_wait

    assert calibration_wait({"train_step": 2, "decode_step": 40}) == (
        "calibrating: train_step has 2 samples of the 4 its fit needs "
        "(the cost model still has its default coefficients)")
    assert calibration_wait({"train_step": 4, "decode_step": 40}, kept_defaults=("decode_step",)) == (
        "calibrating: decode_step's samples do not determine its coefficients "
        "(the cost model still has its default coefficients)")
    assert calibration_wait({"train_step": 4, "decode_step": 6}) is None
    assert calibration_wait({"train_step": 0}, kinds=("decode_step",)) == (
        "calibrating: decode_step has 0 samples of the 6 its fit needs (the cost model still has its default coefficients)")
    default = CostModel(parse_cluster("1x8:a800"), MODELS["qwen3-4b"])
    same_config = [TimingSample("train_step", 100.0 + i, tp=2, pp=1, dp=2, micro_batch=1, sequences=64,
                                tokens=64 * 4000, max_tokens=4000) for i in range(5)]
    assert fit(default, same_config).wait_reason(("train_step",)) == (
        "calibrating: train_step's samples do not determine its coefficients "
        "(the cost model still has its default coefficients)")
