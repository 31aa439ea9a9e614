"""The torch trainer on a tiny random policy: GRPO learns, DDP over gloo equals one process, and a
resumed trainer continues exactly."""

import math
import os
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing as mp

from libra.config import TrainerConfig
from libra.trainer.checkpoint import CheckpointState, latest_checkpoint, load_blob, save_checkpoint
from libra.trainer.samples import to_samples
from libra.trainer.trainer import PolicyTrainer
from tests.libra.trainer.policies import VOCAB, random_samples

PROMPT, GOOD = (2, 3), 5


class Sampled:
    """A one-token trajectory sampled from the trainer's own weights: the 'environment' rewards GOOD."""

    def __init__(self, tid: str, prompt: str, token: int, logprob: float, version: int) -> None:
        self.trajectory_id, self.prompt_id = tid, prompt
        self.ids, self.mask, self.logprobs = [*PROMPT, token], [0, 0, 1], [0.0, 0.0, logprob]
        self.reward, self.model_version = float(token == GOOD), version
        self.versions = [-1, -1, version]


def sample(trainer: PolicyTrainer, prompts: int, per_prompt: int, generator: torch.Generator) -> list[Sampled]:
    with torch.no_grad():
        logp = torch.log_softmax(trainer.model(input_ids=torch.tensor([PROMPT])).logits[0, -1], -1)
    out = []
    for p in range(prompts):
        for s in range(per_prompt):
            token = int(torch.multinomial(logp.exp(), 1, generator=generator))
            out.append(Sampled(f"{p}/{s}", str(p), token, float(logp[token]), trainer.updates))
    return out


def p_good(trainer: PolicyTrainer) -> float:
    with torch.no_grad():
        return float(torch.softmax(trainer.model(input_ids=torch.tensor([PROMPT])).logits[0, -1], -1)[GOOD])


def test_grpo_raises_the_reward_of_a_learnable_environment(tiny_policy):
    trainer = PolicyTrainer(tiny_policy, TrainerConfig(lr=0.05, warmup_steps=0, steps=40, seed=0))
    generator = torch.Generator().manual_seed(0)
    before = p_good(trainer)
    rewards = []
    for _ in range(40):
        batch = sample(trainer, 4, 8, generator)
        rewards.append(sum(t.reward for t in batch) / len(batch))
        stats = trainer.train_step(to_samples(batch))
    assert before == pytest.approx(1 / VOCAB, abs=0.03)  # a random policy: about 1 in 16
    assert p_good(trainer) > 0.9
    assert sum(rewards[-5:]) / 5 > 0.8 > sum(rewards[:5]) / 5
    assert stats.tokens == 32 and stats.sequences == 32


def test_the_first_update_on_its_own_samples_has_no_gap_and_no_clipping(tiny_policy):
    trainer = PolicyTrainer(tiny_policy, TrainerConfig(lr=0.01, warmup_steps=0, seed=0))
    batch = sample(trainer, 2, 4, torch.Generator().manual_seed(1))
    batch[0].reward, batch[4].reward = 1.0, 1.0  # every group has a winner: advantages are not all 0
    stats = trainer.train_step(to_samples(batch))
    assert stats.logprob_gap < 1e-6 and stats.clip_fraction == 0.0 and stats.kl == 0.0
    assert stats.loss == pytest.approx(0.0, abs=1e-6)  # ratio 1: the loss is -mean(advantage) = 0 per group
    assert stats.grad_norm > 0 and stats.lr == 0.01 and stats.tokens == 8


def test_kl_to_the_reference_is_zero_before_training_and_grows_after(tiny_policy):
    trainer = PolicyTrainer(tiny_policy, TrainerConfig(lr=0.05, warmup_steps=0, kl_coef=0.1, seed=0))
    generator = torch.Generator().manual_seed(2)
    first = trainer.train_step(to_samples(sample(trainer, 2, 8, generator)))
    for _ in range(5):
        last = trainer.train_step(to_samples(sample(trainer, 2, 8, generator)))
    assert first.kl == pytest.approx(0.0, abs=1e-7) and last.kl > 1e-4


def test_epochs_are_optimizer_steps_over_the_same_samples_counted_as_one_update(tiny_policy):
    """An update of 3 epochs is 3 one-epoch updates on the same samples, to the bit (constant
    learning rate), counted as one; its statistics are its first pass's."""
    def trainer(epochs: int) -> PolicyTrainer:
        return PolicyTrainer(tiny_policy, TrainerConfig(lr=0.01, warmup_steps=0, epochs=epochs, seed=0))

    three, one = trainer(3), trainer(1)
    batch = sample(one, 2, 4, torch.Generator().manual_seed(1))
    batch[0].reward, batch[4].reward = 1.0, 1.0
    samples = to_samples(batch)
    stats = three.train_step(samples)
    passes = [one.train_step(samples) for _ in range(3)]
    assert (three.updates, one.updates) == (1, 3)
    assert all(torch.equal(a, b) for a, b in zip(three.model.parameters(), one.model.parameters(), strict=True))
    first = passes[0]
    assert (stats.loss, stats.grad_norm, stats.clip_fraction, stats.logprob_gap, stats.tokens) == (
        first.loss, first.grad_norm, first.clip_fraction, first.logprob_gap, first.tokens)
    assert stats.padded_tokens == sum(p.padded_tokens for p in passes)
    assert passes[-1].clip_fraction > 0 or passes[-1].logprob_gap > 0  # the later passes ran off the sampling policy


def test_decoupled_ppo_on_fresh_samples_is_the_plain_update_and_on_stale_ones_clips_around_the_update_start(
        tiny_policy):
    """trainer.decoupled_cap: on samples the trainer's own weights generated the proximal and the
    behaviour policies are one, so the update is the plain one to the bit; on samples from other
    weights its first pass has ratio 1 (nothing clipped) whatever their age, where the plain ratio
    to the behaviour policy clips; and over 3 epochs it is 3 passes clipped around the update's start."""
    def trainer(cap: float, epochs: int = 1) -> PolicyTrainer:
        return PolicyTrainer(tiny_policy, TrainerConfig(lr=0.01, warmup_steps=0, decoupled_cap=cap, epochs=epochs,
                                                        seed=0))

    decoupled, plain = trainer(2.0), trainer(0.0)
    batch = sample(plain, 2, 4, torch.Generator().manual_seed(1))
    batch[0].reward, batch[4].reward = 1.0, 1.0
    samples = to_samples(batch)
    a, b = decoupled.train_step(samples), plain.train_step(samples)
    assert all(torch.equal(x, y) for x, y in zip(decoupled.model.parameters(), plain.model.parameters(), strict=True))
    assert a.loss == b.loss
    stale = [replace(s, behaviour_logprobs=tuple(v - 0.5 * m for v, m in zip(s.behaviour_logprobs, s.loss_mask,
                                                                          strict=True))) for s in samples]
    assert decoupled.train_step(stale).clip_fraction == 0.0 and plain.train_step(stale).clip_fraction > 0
    three = trainer(2.0, epochs=3).train_step(samples)
    assert three.clip_fraction == 0.0  # the first pass's statistics: ratio 1 to the proximal policy


def test_tracking_the_kl_measures_it_without_changing_the_update(tiny_policy):
    """track_kl loads the reference for the `kl` metric alone: with kl_coef 0 the updates are the
    same, to the bit, as without it, and the KL it reports grows from 0 as the policy moves."""
    def run(track: bool):
        trainer = PolicyTrainer(tiny_policy, TrainerConfig(lr=0.05, warmup_steps=0, track_kl=track, seed=0))
        generator = torch.Generator().manual_seed(2)
        stats = [trainer.train_step(to_samples(sample(trainer, 2, 8, generator))) for _ in range(4)]
        return trainer, stats

    tracked, with_kl = run(True)
    plain, without = run(False)
    assert plain.reference is None and tracked.reference is not None
    assert [s.loss for s in with_kl] == [s.loss for s in without]
    assert all(torch.equal(a, b) for a, b in zip(tracked.model.parameters(), plain.model.parameters(), strict=True))
    assert with_kl[0].kl == pytest.approx(0.0, abs=1e-7) and with_kl[-1].kl > 1e-4
    assert all(s.kl == 0.0 for s in without)


# The key projection's bias has no gradient in exact arithmetic (a shift of every key by the same
# vector shifts a query's scores alike, which softmax ignores), so what it gets is rounding noise,
# and summing over two ranks instead of one changes that noise; AdamW's step lr * g / (|g| + eps)
# turns it into a move of up to lr. Measured: 1.35e-6 on that bias at lr 1e-2 (torch 2.13, CPU),
# past 1e-6, and 1.1e-7 at lr 1e-3, where the check keeps a 9x margin while a rank's gradient
# lost or counted twice still moves nearly every element by about lr.
DDP_LR = 1e-3


def _rank(rank: int, world: int, policy: str, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        trainer = PolicyTrainer(policy, TrainerConfig(lr=DDP_LR, warmup_steps=0, micro_batch_tokens=64, seed=0))
        stats = [trainer.train_step(random_samples(seed)) for seed in (0, 1)]
        if rank == 0:
            torch.save({"state": trainer.model.state_dict(), "stats": stats}, out)
        dist.barrier()  # a peer that tears its group down while the other still reads can abort it (SIGABRT)
    finally:
        dist.destroy_process_group()


def test_two_ddp_ranks_over_gloo_make_the_same_update_as_one_process(tiny_policy, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "ddp.pt"
    mp.start_processes(_rank, args=(2, str(tiny_policy), port, str(out)), nprocs=2, join=True, start_method="spawn")
    ddp = torch.load(out, weights_only=False)
    torch.set_num_threads(1)
    single = PolicyTrainer(tiny_policy, TrainerConfig(lr=DDP_LR, warmup_steps=0, micro_batch_tokens=64, seed=0))
    stats = [single.train_step(random_samples(seed)) for seed in (0, 1)]
    for name, value in single.model.state_dict().items():
        assert torch.allclose(ddp["state"][name], value, atol=1e-6, rtol=0), name
    for got, want in zip(ddp["stats"], stats, strict=True):
        assert got.tokens == want.tokens and got.loss == pytest.approx(want.loss, abs=1e-6)
        assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-5)


def test_a_trainer_resumed_from_a_checkpoint_continues_exactly(tiny_policy, tmp_path):
    config = TrainerConfig(lr=0.01, warmup_steps=3, steps=4, seed=0)
    straight = PolicyTrainer(tiny_policy, config)
    for seed in range(4):
        straight.train_step(random_samples(seed))

    first = PolicyTrainer(tiny_policy, config)
    for seed in range(2):
        first.train_step(random_samples(seed))
    path = save_checkpoint(tmp_path, CheckpointState("r", 2, 2, "x"), first.save_weights, {"trainer": first.optimizer_state()})
    assert latest_checkpoint(tmp_path) == path
    resumed = PolicyTrainer(path, config)
    resumed.load_optimizer_state(load_blob(path, "trainer"))
    assert resumed.updates == 2
    for seed in (2, 3):
        resumed.train_step(random_samples(seed))
    for name, value in straight.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name


def test_an_update_whose_gradient_is_not_finite_leaves_the_weights_and_says_so():
    """The last line of defence: AdamW would write NaN into every weight (and the engines would take
    them). The update is refused, the weights and the optimizer's state unchanged."""
    from libra.errors import LibraError
    from libra.trainer.trainer import take_update

    model = torch.nn.Linear(3, 2)
    config = TrainerConfig()
    optimizer = torch.optim.AdamW(model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.ones(1, 3)).sum().backward()
    model.weight.grad[0, 0] = math.nan
    with pytest.raises(LibraError, match=r"^update 1: the gradient's norm is nan; the weights were left as they were"):
        take_update(model, optimizer, config, 0)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert optimizer.state == {} and all(p.grad is None for p in model.parameters())
