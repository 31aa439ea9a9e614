"""The megatron-core trainer against the torch trainer on the same batch: the loss within 1e-5 and
the weights after one update within 1e-5 (float32, CPU, gloo), for TP=PP=DP=1 and for TP=2, PP=2
and DP=2 on two processes; its optimizer state resumes the torch trainer exactly."""

import copy
from pathlib import Path

import pytest
import torch

from libra.config import TrainerConfig
from libra.errors import LibraError, RankLostError
from libra.trainer.layout import Layout
from libra.trainer.megatron_trainer import MegatronTrainer
from libra.trainer.trainer import PolicyTrainer
from tests.libra.trainer.policies import assert_same_policy, random_samples

# Summing the same gradients in another order (shards, replicas, stages) changes their rounding, and
# AdamW's first step, lr * g / (|g| + eps), turns a relative change d of an element's gradient into a
# move of up to lr * d / 4 (at |g| = eps). Measured here over three batches and the three layouts, the
# largest weight gap is proportional to the learning rate: 1.9e-5 at lr 1e-2, 1.9e-6 at lr 1e-3. So the
# tests train at lr 1e-3, where 1e-5 is 1% of the largest move an element makes, still far below what
# a shard lost or counted twice does (moves of the order of lr in nearly every element).
CONFIG = TrainerConfig(lr=1e-3, warmup_steps=0, seed=0, micro_batch_tokens=64, steps=4, kl_coef=0.05)


@pytest.fixture(scope="module")
def gqa_policy(tmp_path_factory) -> Path:
    """Two layers (so PP=2 has a layer a stage), 4 query heads on 2 key/value heads, tied head."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = tmp_path_factory.mktemp("gqa-policy")
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=17, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=64, max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=0,
                         eos_token_id=1, bos_token_id=None)
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out


def hf_weights(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.model.state_dict().items() if k != "lm_head.weight"}


LAYOUTS = [Layout(), Layout(tp=2), Layout(pp=2), Layout(dp=2)]


def layout_id(layout: Layout) -> str:
    return f"tp{layout.tp}-pp{layout.pp}-dp{layout.dp}"


def one_update_of_each(policy: Path, layout: Layout, device: str = "cpu"):
    """The torch trainer and the megatron trainer in `layout` each take one update on the same
    samples: (megatron's stats, its HF weights, the torch trainer's stats, the torch trainer)."""
    samples = random_samples(1)
    torch_trainer = PolicyTrainer(policy, CONFIG, device=device)
    want = torch_trainer.train_step(samples)
    megatron = MegatronTrainer(policy, CONFIG, layout=layout, device=device)
    try:
        got = megatron.train_step(samples)
        weights = megatron.hf_state_dict()
    finally:
        megatron.close()
    return got, weights, want, torch_trainer


@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_one_update_equals_the_torch_trainers(gqa_policy, layout):
    got, weights, want, torch_trainer = one_update_of_each(gqa_policy, layout)
    assert got.loss == pytest.approx(want.loss, abs=1e-5)
    assert got.kl == pytest.approx(want.kl, abs=1e-6)  # 0: the weights are the reference's
    assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-5)
    assert got.entropy == pytest.approx(want.entropy, abs=1e-5)
    assert (got.tokens, got.sequences, got.lr) == (want.tokens, want.sequences, want.lr) == (150, 6, 1e-3)
    assert_same_policy(weights, hf_weights(torch_trainer), atol=1e-5)


def test_its_checkpoint_resumes_the_torch_trainer_and_the_torch_trainers_resumes_it(gqa_policy, tmp_path):
    """Weights in HF form and AdamW's state in the torch trainer's layout: a run may change backend
    (or layout) at a checkpoint."""
    first, second = random_samples(1), random_samples(2)
    reference = PolicyTrainer(gqa_policy, CONFIG)
    reference.train_step(first)
    torch_state = copy.deepcopy(reference.optimizer_state())  # (its tensors are the live ones)
    reference.save_weights(tmp_path / "torch-1")
    want = reference.train_step(second)

    megatron = MegatronTrainer(tmp_path / "torch-1", CONFIG, layout=Layout(tp=2), reference_dir=gqa_policy)
    try:
        megatron.load_optimizer_state(torch_state)
        got = megatron.train_step(second)
        weights = megatron.hf_state_dict()
        state = megatron.optimizer_state()
        megatron.save_weights(tmp_path / "megatron-2")
    finally:
        megatron.close()
    assert got.loss == pytest.approx(want.loss, abs=1e-5) and got.lr == want.lr
    assert got.kl == pytest.approx(want.kl, abs=1e-6) and want.kl > 0  # one update from the reference
    assert_same_policy(weights, hf_weights(reference), atol=1e-5)
    assert state["updates"] == 2
    resumed = PolicyTrainer(tmp_path / "megatron-2", CONFIG, reference_dir=gqa_policy)
    resumed.load_optimizer_state(state)
    assert_same_policy(hf_weights(resumed), hf_weights(reference), atol=1e-5)
    for i, moments in reference.optimizer_state()["optimizer"]["state"].items():
        ours = resumed.optimizer.state_dict()["state"][i]
        assert torch.allclose(ours["exp_avg"], moments["exp_avg"], atol=1e-7)
        assert float(ours["step"]) == float(moments["step"]) == 2.0


def test_a_relayout_reshards_the_weights_and_optimizer_and_training_goes_on_as_the_torch_trainers(gqa_policy):
    """Two updates in TP=2 (ranks pinned to a core each), then the layout the planner may move the
    trainer to (DP=2): the third update equals the torch trainer's three, so nothing of the weights
    or AdamW's moments was lost or split wrongly on the way."""
    import os

    batches = [random_samples(1), random_samples(2), random_samples(3)]
    reference = PolicyTrainer(gqa_policy, CONFIG)
    want = [reference.train_step(b) for b in batches]
    cores = sorted(os.sched_getaffinity(0))[:2]
    megatron = MegatronTrainer(gqa_policy, CONFIG, layout=Layout(tp=2), units=cores)
    try:
        pinned = [set(os.sched_getaffinity(p.pid)) for p in megatron._ranks]
        got = [megatron.train_step(b) for b in batches[:1]]
        with pytest.raises(LibraError, match="tp=3 does not divide"):  # refused before any rank stops
            megatron.relayout(Layout(tp=3), cores)
        megatron.place(cores[::-1])  # the same layout on the cores the other way round
        swapped = [set(os.sched_getaffinity(p.pid)) for p in megatron._ranks]
        got.append(megatron.train_step(batches[1]))
        seconds = megatron.relayout(Layout(dp=2), cores)
        assert megatron.layout == Layout(dp=2) and megatron.updates == 2 and seconds > 0
        got.append(megatron.train_step(batches[2]))
        weights = megatron.hf_state_dict()
    finally:
        megatron.close()
    assert pinned == [{cores[0]}, {cores[1]}]  # each rank on its run of the trainer's cores
    assert swapped == [{cores[1]}, {cores[0]}]
    for g, w in zip(got, want, strict=True):
        assert g.loss == pytest.approx(w.loss, abs=1e-5) and g.lr == w.lr
        assert g.grad_norm == pytest.approx(w.grad_norm, rel=1e-4)
    assert got[2].kl == pytest.approx(want[2].kl, abs=1e-6) and want[2].kl > 0
    assert_same_policy(weights, hf_weights(reference), atol=1e-5)


def test_more_ranks_than_units_is_refused_before_any_rank_starts(gqa_policy):
    with pytest.raises(LibraError, match=r"layout tp=1 pp=2 dp=2 needs 4 rank processes, each on a unit of its own, "
                                         r"but the trainer has 2 workers' cores"):
        MegatronTrainer(gqa_policy, CONFIG, layout=Layout(pp=2, dp=2), units=(0, 1))


def test_a_layout_the_model_cannot_take_is_refused_before_any_rank_starts(gqa_policy):
    with pytest.raises(LibraError, match="tp=3 does not divide the model's 4 attention heads"):
        MegatronTrainer(gqa_policy, CONFIG, layout=Layout(tp=3))


def test_a_rank_that_dies_is_a_rank_lost_error_and_the_others_are_stopped(gqa_policy):
    megatron = MegatronTrainer(gqa_policy, CONFIG, layout=Layout(tp=2), poll_s=0.02)
    ranks = list(megatron._ranks)
    try:
        ranks[1].kill()
        ranks[1].join(10)
        with pytest.raises(RankLostError, match=r"megatron trainer rank 1 \(tp=2 pp=1 dp=1\) died") as lost:
            megatron.train_step(random_samples(1))
        assert lost.value.rank == 1
        assert not any(process.is_alive() for process in ranks)  # rank 0 stopped with it, not left waiting
    finally:
        megatron.close()


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_on_cuda_one_update_equals_the_torch_trainers(gqa_policy, layout):
    """The CPU equivalence on GPUs: NCCL between the ranks, one GPU a rank, the torch trainer on GPU 0."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < layout.world:
        pytest.skip(f"needs {layout.world} CUDA device(s)")
    got, weights, want, torch_trainer = one_update_of_each(gqa_policy, layout, "cuda")
    assert got.loss == pytest.approx(want.loss, abs=1e-5)
    assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-5)
    assert_same_policy({k: v.cpu() for k, v in weights.items()}, {k: v.cpu() for k, v in hf_weights(torch_trainer).items()},
                       atol=1e-5)
