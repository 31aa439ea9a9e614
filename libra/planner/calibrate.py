"""Calibration: fit the cost model's coefficients to measured timings, so plans follow the machine.

Each sample is a measured (configuration, tokens) -> seconds observation of one of three kinds:
a training step, a decode step of an instance, or a prefill. The cost model expresses each as
coefficients times ideal terms (`cost_model`), so fitting is least squares on relative error with
non-negative coefficients:

    train_step   seconds = train_compute * compute + train_comm * comm + train_step_s
    prefill      seconds = prefill_compute * flops_time
    decode_step  seconds = max(decode_compute * gemm, decode_memory * weights) + decode_kv * kv
                           + decode_kv_tail * one sequence's kv + rollout_comm * comm
                           + decode_step_s + decode_seq_s * batch

The max() of the GEMM phase is fitted by alternating: label each sample with the bound that binds
under the current coefficients, solve the linear problem, repeat until the labels settle.
Decode samples are weighted by the fitted time rather than the measured one (iteratively), and a
sample more than 3x off the fit is set aside (at most a quarter of them), so that a few near-empty
engine steps do not decide the fit. The terms that shrink with the instance's size (compute,
memory, all-reduces) are told apart from the host's overheads, which do not, only by samples of more
than one instance size. With one size, the weights' read and the all-reduces (the same at every
batch) keep their values and the terms that vary with the batch and the context are fitted (the
GEMMs, the KV reads, the overheads); where the samples cannot separate those, only the overheads.
Coefficients of a kind with too few samples keep their current values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from scipy.optimize import nnls

from libra.planner.cost_model import Coefficients, CostModel, TrainConfig
from libra.planner.workload import LengthBucket, Workload

Kind = Literal["train_step", "decode_step", "prefill"]
MIN_SAMPLES = {"train_step": 4, "decode_step": 6, "prefill": 2}


@dataclass(frozen=True)
class TimingSample:
    kind: Kind
    seconds: float  # measured
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    micro_batch: int = 1
    sequences: float = 0.0  # train_step: sequences in the step
    tokens: float = 0.0  # train_step: tokens in the step; prefill: new tokens
    max_tokens: int = 0  # train_step: longest sequence
    batch: float = 0.0  # decode_step: concurrent sequences
    context_tokens: float = 0.0  # decode_step / prefill: mean attended context


@dataclass(frozen=True)
class FitResult:
    coefficients: Coefficients
    samples: dict[str, int]  # samples used per kind
    mean_abs_rel_error: dict[str, float]  # on the samples, after fitting
    rejected: int = 0  # samples dropped as invalid (non-positive or non-finite values)
    kept_defaults: tuple[str, ...] = ()  # kinds whose samples could not determine the coefficients
    set_aside: int = 0  # decode samples more than 3x off the fit, not used (nor in the errors)

    def wait_reason(self, kinds: Sequence[str] = ("train_step", "decode_step")) -> str | None:
        """Why decisions that rest on `kinds` should wait for more measurements, or None: see
        `calibration_wait`."""
        return calibration_wait(self.samples, kinds, self.kept_defaults)


def calibration_wait(samples: dict[str, int], kinds: Sequence[str] = ("train_step", "decode_step"),
                     kept_defaults: Sequence[str] = ()) -> str | None:
    """Why a decision resting on `kinds` should wait, or None: a kind with fewer samples than its
    fit needs (`MIN_SAMPLES`), or whose samples could not determine it, still has the cost model's
    default coefficients, which are guesses (a run's first plan comes after two iterations: two
    training samples). The live planning flow and the simulator's replay of it hold moves on it."""
    waiting = [f"{kind} has {samples.get(kind, 0)} samples of the {MIN_SAMPLES[kind]} its fit needs"
               if samples.get(kind, 0) < MIN_SAMPLES[kind] else f"{kind}'s samples do not determine its coefficients"
               for kind in kinds if samples.get(kind, 0) < MIN_SAMPLES[kind] or kind in kept_defaults]
    if not waiting:
        return None
    return "calibrating: " + "; ".join(waiting) + " (the cost model still has its default coefficients)"


def _train_workload(sample: TimingSample) -> Workload:
    mean = sample.tokens / sample.sequences
    return Workload((LengthBucket(sample.max_tokens, sample.sequences, 0.0, mean, 0.0, 1.0, 0.0, mean * mean,
                                  sample.max_tokens, 1, 0.0),))


def features(cost: CostModel, sample: TimingSample) -> tuple[float, ...]:
    """The ideal terms the sample's time is a combination of (see the module docstring)."""
    if sample.kind == "train_step":
        config = TrainConfig(sample.tp, sample.pp, sample.dp, sample.ep, sample.micro_batch)
        estimate = cost.train_time(config, _train_workload(sample))
        return estimate.compute_ideal_s, estimate.comm_ideal_s, 1.0
    if sample.kind == "prefill":
        return (cost.prefill_ideal_s(sample.tp, sample.tokens, sample.context_tokens),)
    gemm, weights, kv, one, comm = cost.decode_step_features(sample.tp, sample.batch, sample.context_tokens)
    return gemm, weights, kv, one, comm, 1.0, sample.batch


def predict(cost: CostModel, sample: TimingSample) -> float:
    c, f = cost.coefficients, features(cost, sample)
    if sample.kind == "train_step":
        return c.train_compute * f[0] + c.train_comm * f[1] + c.train_step_s * f[2]
    if sample.kind == "prefill":
        return c.prefill_compute * f[0]
    return (max(c.decode_compute * f[0], c.decode_memory * f[1]) + c.decode_kv * f[2] + c.decode_kv_tail * f[3]
            + c.rollout_comm * f[4] + c.decode_step_s * f[5] + c.decode_seq_s * f[6])


def samples_from_rows(rows: Sequence[dict]) -> list[TimingSample]:
    """Rows of the store's `timings` table (the `timing_samples` query) as samples; rows of other
    kinds (engine_start) are not cost-model samples and are left out, a row's other columns are
    ignored and its nulls take the sample's defaults."""
    fields = set(TimingSample.__dataclass_fields__)
    return [TimingSample(**{k: v for k, v in row.items() if k in fields and v is not None})
            for row in rows if row.get("kind") in MIN_SAMPLES]


def valid(sample: TimingSample) -> bool:
    """A sample the fit can use: positive finite time and the sizes its kind needs."""
    if sample.kind not in MIN_SAMPLES or not (math.isfinite(sample.seconds) and sample.seconds > 0 and sample.tp >= 1):
        return False
    if sample.kind == "train_step":
        return sample.sequences > 0 and sample.tokens > 0 and sample.max_tokens > 0 and min(sample.pp, sample.dp, sample.ep, sample.micro_batch) >= 1
    if sample.kind == "prefill":
        return sample.tokens > 0 and sample.context_tokens >= 0
    return sample.batch > 0 and sample.context_tokens >= 0


class Underdetermined(Exception):
    """The samples do not pin down the coefficients (too few distinct configurations)."""


def _solve(rows: list[tuple[float, ...]], seconds: list[float], active: list[int], current: list[float],
           scale: Sequence[float] | None = None) -> list[float]:
    """Non-negative least squares on error relative to `scale` (default: the measured seconds) over
    the `active` columns; others keep `current`."""
    a = np.array(rows, dtype=float)
    y = np.array(seconds, dtype=float)
    fixed = [i for i in range(a.shape[1]) if i not in active]
    target = y - (a[:, fixed] @ np.array([current[i] for i in fixed]) if fixed else 0.0)
    weights = 1.0 / (y if scale is None else np.asarray(scale, dtype=float))
    design = a[:, active] * weights[:, None]
    if np.linalg.matrix_rank(design / np.maximum(np.abs(design).max(axis=0), 1e-300)) < len(active):
        raise Underdetermined()
    solution, _ = nnls(design, target * weights)
    out = list(current)
    for i, value in zip(active, solution, strict=True):
        out[i] = float(value)
    return out


def fit(cost: CostModel, samples: Sequence[TimingSample], max_rounds: int = 50) -> FitResult:
    """Coefficients that best explain `samples`; starts from (and falls back to) `cost.coefficients`."""
    c = cost.coefficients
    usable = [s for s in samples if valid(s)]
    by_kind: dict[str, list[TimingSample]] = {k: [s for s in usable if s.kind == k] for k in MIN_SAMPLES}
    values = {name: getattr(c, name) for name in Coefficients.names()}
    kept: list[str] = []

    train = by_kind["train_step"]
    if len(train) >= MIN_SAMPLES["train_step"]:
        names = ["train_compute", "train_comm", "train_step_s"]
        rows = [features(cost, s) for s in train]
        active = [i for i in range(3) if any(r[i] > 0 for r in rows)]
        try:
            values.update(zip(names, _solve(rows, [s.seconds for s in train], active, [values[n] for n in names]), strict=True))
        except Underdetermined:
            kept.append("train_step")

    prefill = by_kind["prefill"]
    if len(prefill) >= MIN_SAMPLES["prefill"]:
        try:
            values["prefill_compute"] = _solve([features(cost, s) for s in prefill], [s.seconds for s in prefill], [0],
                                               [values["prefill_compute"]])[0]
        except Underdetermined:
            kept.append("prefill")

    decode = by_kind["decode_step"]
    outliers: set[int] = set()
    if len(decode) >= MIN_SAMPLES["decode_step"]:
        names = ["decode_compute", "decode_memory", "decode_kv", "decode_kv_tail", "rollout_comm", "decode_step_s",
                 "decode_seq_s"]
        start = [values[n] for n in names]
        raw, seconds = [features(cost, s) for s in decode], [s.seconds for s in decode]
        free = [0, 1, 2, 3, 4, 5, 6] if len({s.tp for s in decode}) > 1 else [0, 2, 3, 5, 6]
        try:
            current, outliers = _fit_decode(raw, seconds, start, free, max_rounds)
        except Underdetermined:
            try:  # the samples cannot separate the device's terms: fit the host's alone
                current, outliers = _fit_decode(raw, seconds, start, [5, 6], max_rounds)
            except Underdetermined:
                current = start
                kept.append("decode_step")
        values.update(zip(names, current, strict=True))
        by_kind["decode_step"] = [s for i, s in enumerate(decode) if i not in outliers]

    fitted = replace(cost, coefficients=Coefficients(**values))
    errors = {
        kind: sum(abs(predict(fitted, s) - s.seconds) / s.seconds for s in group) / len(group)
        for kind, group in by_kind.items() if group
    }
    return FitResult(fitted.coefficients, {k: len(v) for k, v in by_kind.items()}, errors,
                     rejected=len(samples) - len(usable), kept_defaults=tuple(kept), set_aside=len(outliers))


OUTLIER_RATIO = 3.0  # a decode sample this many times off the fit (either way) is set aside
MAX_SET_ASIDE = 0.25  # ... unless more than this share would be: then the model, not the samples, is off


def _fit_decode(raw: list[tuple[float, ...]], seconds: list[float], start: list[float], free: list[int],
                max_rounds: int) -> tuple[list[float], set[int]]:
    """The decode coefficients (`free` columns fitted, the others kept at `start`) and the indices
    of the samples set aside. Alternates the roofline's labels, the weights (1 / fitted seconds) and
    the set-aside samples until all three settle."""
    current = list(start)
    y = np.array(seconds, dtype=float)
    scale = y.copy()  # the first round: relative to the measured time
    keep = np.ones(len(raw), dtype=bool)
    state = None
    for _ in range(max_rounds):
        compute_bound = [current[0] * r[0] >= current[1] * r[1] for r in raw]
        rows = [(r[0] if cb else 0.0, 0.0 if cb else r[1], *r[2:]) for r, cb in zip(raw, compute_bound, strict=True)]
        kept_rows = [row for row, k in zip(rows, keep, strict=True) if k]
        active = [i for i in free if any(row[i] > 0 for row in kept_rows)]
        current = _solve(kept_rows, list(y[keep]), active, current, scale[keep])
        fitted = np.array(rows, dtype=float) @ np.array(current)
        ratio = np.where(fitted > 0, y / np.maximum(fitted, 1e-300), np.inf)
        off = (ratio > OUTLIER_RATIO) | (ratio < 1 / OUTLIER_RATIO)
        kept_before = keep
        keep = ~off if off.mean() <= MAX_SET_ASIDE else np.ones(len(raw), dtype=bool)
        scale = np.where(fitted > 0, fitted, y)
        if (keep != kept_before).any():  # other samples: start again from the first labels (the set aside ones may
            current = list(start)  # have pulled a term to zero, whose labels would then never come back)
        settled = (tuple(compute_bound), tuple(keep), tuple(round(v, 12) for v in current))
        if settled == state:
            break
        state = settled
    return current, {i for i, k in enumerate(keep) if not k}


def mean_abs_rel_error(cost: CostModel, samples: Sequence[TimingSample]) -> float:
    errors = [abs(predict(cost, s) - s.seconds) / s.seconds for s in samples if valid(s)]
    return sum(errors) / len(errors) if errors else math.nan
