"""Every trainer meets the `Trainer` protocol (and the narrower one of its placement) structurally:
each of the protocol's members is there, and each method takes the protocol's parameters."""

import inspect

import pytest

from libra.clock import SimClock
from libra.config import PoolConfig, RolloutConfig, TrainerConfig
from libra.trainer.layout import Layout
from libra.trainer.protocol import ElasticTrainer, ShardedTrainer, Trainer
from tests.libra.trainer.policies import random_samples

CONFIG = TrainerConfig(lr=1e-3, steps=2, micro_batch_tokens=64, seed=0)


def members(protocol: type) -> dict[str, object]:
    """The protocol's own and inherited members: its methods and its annotated attributes."""
    out: dict[str, object] = {}
    for cls in reversed(protocol.__mro__):
        if cls is object or not getattr(cls, "_is_protocol", False) or cls.__module__ == "typing":
            continue
        out |= {name: value for name, value in vars(cls).items() if not name.startswith("_") and callable(value)}
        out |= {name: None for name in getattr(cls, "__annotations__", {})}
    return out


def assert_meets(trainer: object, protocol: type) -> None:
    assert isinstance(trainer, protocol)
    for name, method in members(protocol).items():
        assert hasattr(trainer, name), name
        if method is None:
            continue
        want = list(inspect.signature(method).parameters.values())[1:]
        got = list(inspect.signature(getattr(trainer, name)).parameters.values())
        assert [(p.name, p.kind, p.default) for p in got] == [(p.name, p.kind, p.default) for p in want], name


def test_the_torch_trainer_is_a_trainer_without_a_layout_or_a_pool(tiny_policy):
    from libra.trainer.trainer import PolicyTrainer

    trainer = PolicyTrainer(tiny_policy, CONFIG)
    assert_meets(trainer, Trainer)
    assert not isinstance(trainer, ShardedTrainer) and not isinstance(trainer, ElasticTrainer)


def test_the_pooled_trainer_is_an_elastic_trainer(tiny_policy, tmp_path):
    from libra.trainer.pooled import PooledTrainer

    trainer = PooledTrainer(tiny_policy, CONFIG, RolloutConfig(), PoolConfig(), tmp_path / "pool", hybrids=0)
    try:
        assert_meets(trainer, ElasticTrainer)
        assert not isinstance(trainer, ShardedTrainer)
    finally:
        trainer.close()


def test_the_megatron_trainer_is_a_sharded_trainer(tiny_policy):
    from libra.trainer.megatron_trainer import MegatronTrainer

    trainer = MegatronTrainer(tiny_policy, CONFIG.model_copy(update={"backend": "megatron"}), layout=Layout(), threads=1)
    try:
        assert_meets(trainer, ShardedTrainer)
        assert not isinstance(trainer, ElasticTrainer)
    finally:
        trainer.close()


def test_an_updates_seconds_are_read_on_the_trainers_clock(tiny_policy):
    from libra.trainer.trainer import PolicyTrainer

    clock = SimClock(5.0)
    stats = PolicyTrainer(tiny_policy, CONFIG, clock=clock).train_step(random_samples(0))
    assert stats.seconds == 0.0 and stats.tokens > 0


@pytest.mark.parametrize("protocol", [Trainer, ShardedTrainer, ElasticTrainer])
def test_the_protocols_name_what_the_session_calls(protocol):
    names = set(members(protocol))
    assert {"train_step", "updates", "save_weights", "optimizer_state", "load_optimizer_state", "threads",
            "set_threads", "close"} <= names
