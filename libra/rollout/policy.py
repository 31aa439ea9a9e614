"""A local policy that really generates: a small Qwen2-architecture causal LM in HF format, with a
byte-level BPE tokenizer trained on the environments' text, warm-started by supervised training on
the scripted experts' demonstrations (loss on the model's own turns only, not on prompts or tool
outputs).

    libra policy init --out DIR             # DIR gets the shipped policy, or a rebuilt one
    libra policy init --out DIR --rebuild   # trains it from scratch: about 55 minutes on a 2-core CPU
    libra policy tune --env math            # .libra/policy-math: the policy after more math demonstrations

The head size is 64 (vLLM's CPU attention supports it); any HF-format checkpoint can be used in its
place on a real cluster. `DIR/libra_policy.json` records how the policy was built; a directory whose
record matches the requested settings is reused as is. The policy built with the default settings
ships in `data/policy/` (`libra policy init --out data/policy --rebuild` makes it again), so a fresh
machine copies it instead of spending the build's minutes.

`tune_policy` is the stage an RL run starts from when the warm start is not enough: continued
supervision of a built policy on one environment's demonstrations, fresh tasks each seen once. The
shipped policy copies the math tool's inputs from the question badly (most of its wrong answers
carry a wrong number into the call), and a 0/1 reward on its own samples is too thin a signal to
teach that within a short run; after 4,800 more math demonstrations it solves about twice as many
held-out tasks (0.305 against 0.148, greedy). That policy ships in `data/policy-math/` and the main
job trains it.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from libra.checks import missing_policy
from libra.clock import Stopwatch
from libra.config import SandboxConfig
from libra.errors import LibraError, first_line
from libra.optim import learning_rate, make_optimizer, set_learning_rate
from libra.rollout.envs import ENVS, demonstration, fresh_tasks, make_env
from libra.rollout.protocol import SPECIAL
from libra.rollout.workroots import temporary_workroot

PAD, EOS = "<|pad|>", "<|eos|>"
SHIPPED = Path(__file__).resolve().parents[2] / "data" / "policy"  # the default settings' policy
SHIPPED_TUNED = {"math": SHIPPED.with_name("policy-math")}  # the default tune of the shipped policy, by environment
TUNE_TASK_SEED = 20_000  # tuning's tasks: not the held-out (0), the warm start's (10_000 + seed) nor training's (1e6+) seeds
POLICY_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "libra_policy.json")


@dataclass(frozen=True)
class PolicySettings:
    envs: tuple[str, ...] = ENVS
    demos_per_env: int = 400
    vocab_size: int = 1536
    hidden: int = 256
    layers: int = 4
    heads: int = 4  # head size = hidden / heads = 64
    intermediate: int = 768
    max_positions: int = 2048
    steps: int = 600
    batch: int = 16
    lr: float = 2e-3
    seed: int = 0
    tokenizer: str = "bpe-digits"  # recorded so a policy built with another tokenizer is rebuilt
    demonstrations: str = "think-then-act"  # the experts' turns: a line of reasoning, then the action (likewise)

    def __post_init__(self) -> None:
        unknown = [e for e in self.envs if e not in ENVS]
        if unknown or not self.envs:
            raise LibraError(f"unknown environments {unknown or '(none)'}; environments: {', '.join(ENVS)}")
        if self.hidden % self.heads or self.hidden // self.heads not in (32, 64, 80, 96, 112, 128):
            raise LibraError(f"hidden {self.hidden} / heads {self.heads} must be a head size vLLM's CPU attention "
                             "supports (32, 64, 80, 96, 112, 128)")


def demonstrations(settings: PolicySettings, sandbox: SandboxConfig | None = None) -> list[tuple[str, list[tuple[int, int]]]]:
    demos = []
    for name in settings.envs:
        env = make_env(name, sandbox)
        for task in env.tasks(settings.demos_per_env, seed=10_000 + settings.seed):  # train seeds; evaluation uses others
            with temporary_workroot("libra-demo-") as workdir:
                demos.append(demonstration(env, task, workdir))
    random.Random(settings.seed).shuffle(demos)
    return demos


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # digits are single tokens wherever they stand, so copying a number from the question or a tool
    # output into a call or an answer is copying the same tokens
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                  pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS, *SPECIAL],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, bos_token=None)
    fast.add_special_tokens({"additional_special_tokens": list(SPECIAL)})
    return fast


def build_model(settings: PolicySettings, vocab: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=vocab, hidden_size=settings.hidden, num_hidden_layers=settings.layers,
                         num_attention_heads=settings.heads, num_key_value_heads=settings.heads,
                         intermediate_size=settings.intermediate, max_position_embeddings=settings.max_positions,
                         tie_word_embeddings=True, torch_dtype="float32", rope_theta=10000.0,
                         bos_token_id=None, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(settings.seed)
    return Qwen2ForCausalLM(config)


def encode(tokenizer, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Token ids of the transcript (plus EOS) and labels (-100 outside the model's own turns)."""
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    labels = []
    for token, (start, end) in zip(enc["input_ids"], enc["offset_mapping"], strict=True):
        inside = any(s <= start and end <= e for s, e in spans)
        labels.append(token if inside else -100)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    return enc["input_ids"] + [eos], labels + [eos]


def supervised_step(model, optimizer: torch.optim.Optimizer, batch: list[tuple[list[int], list[int]]]) -> float:
    """One supervised update on `batch` (token ids and labels, as `encode` makes them): the mean
    cross-entropy on the labelled tokens, the gradient clipped to norm 1; returns the loss."""
    width = max(len(ids) for ids, _ in batch)
    ids = torch.tensor([i + [0] * (width - len(i)) for i, _ in batch])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch])
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def _record_if_built_with(directory: Path, settings: PolicySettings) -> dict | None:
    record = _record_or_none(directory)
    return record if record is not None and record.get("settings") == json.loads(json.dumps(asdict(settings))) else None


def init_policy(out: str | Path, settings: PolicySettings = PolicySettings(), log=print,
                progress: Callable[[int, int, float], None] | None = None,
                sandbox: SandboxConfig | None = None, rebuild: bool = False) -> dict:
    """Build (or reuse) the policy in `out`; returns its record. Unless `rebuild`, a policy in `out`
    built with `settings` is kept, and the shipped one is copied when it was built with them.
    `progress` hears (training steps done, steps, the step's loss) after each step; the
    demonstrations' tools run in the sandbox `sandbox` configures."""
    out = _policy_out(out)
    if not rebuild:
        if (record := _record_if_built_with(out, settings)) is not None:
            log(f"policy in {out} is up to date (built in {record['train_s']:.0f} s, final loss {record['final_loss']:.3f})")
            return record
        if (record := _record_if_built_with(SHIPPED, settings)) is not None and out.resolve() != SHIPPED:
            out.mkdir(parents=True, exist_ok=True)
            for name in POLICY_FILES:  # the record last: it marks a whole copy
                shutil.copyfile(SHIPPED / name, out / name)
            log(f"policy in {out}: copied the shipped policy (final loss {record['final_loss']:.3f})")
            return record
    torch.set_num_threads(max(1, torch.get_num_threads()))
    build = Stopwatch()
    demos = demonstrations(settings, sandbox)
    tokenizer = train_tokenizer([text for text, _ in demos], settings.vocab_size)
    examples = [encode(tokenizer, text, spans) for text, spans in demos]
    longest = max(len(ids) for ids, _ in examples)
    if longest > settings.max_positions:
        raise LibraError(f"a demonstration has {longest} tokens, more than max_positions {settings.max_positions}")
    model = build_model(settings, len(tokenizer))
    optimizer = make_optimizer(model.parameters(), settings.lr)
    rng = random.Random(settings.seed)
    losses = []
    model.train()
    for step in range(settings.steps):
        set_learning_rate(optimizer, learning_rate(step, settings.steps, settings.lr, warmup=50))
        losses.append(supervised_step(model, optimizer, rng.sample(examples, settings.batch)))
        if progress:
            progress(step + 1, settings.steps, losses[-1])
        if step % 100 == 0 or step == settings.steps - 1:
            log(f"step {step:5d}  loss {sum(losses[-50:]) / len(losses[-50:]):.4f}  ({build.seconds():.0f} s)")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    record = {"settings": json.loads(json.dumps(asdict(settings))), "parameters": sum(p.numel() for p in model.parameters()),
              "demonstrations": len(demos), "longest_tokens": longest, "train_s": build.seconds(),
              "final_loss": sum(losses[-50:]) / len(losses[-50:])}
    (out / "libra_policy.json").write_text(json.dumps(record, indent=2))
    return record


def _policy_out(out: str | Path, tuned: bool = False) -> Path:
    """The directory `libra policy init` (`tune`: `libra policy tune`) writes its policy to, refused
    (nothing written) where writing it would replace what that command did not write: a file, or a
    directory that holds anything but a policy the same command built."""
    command = "libra policy tune" if tuned else "libra policy init"
    if not str(out).strip():
        raise LibraError("the policy's directory (--out) is empty: give a directory, e.g. --out .libra/policy")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise LibraError(f"{out} is a file, not a directory: give --out a new or empty directory for the policy")
    if out.is_dir() and any(out.iterdir()):
        try:
            record = _record_or_none(out)
        except LibraError:  # unreadable, or not a JSON object: not a record a build wrote
            record = None
        if not isinstance(record, dict) or ("tuned" in record) != tuned:
            held = sorted(p.name for p in out.iterdir())
            raise LibraError(f"{out} holds files that `{command}` did not write ({', '.join(held[:5])}"
                             f"{', ...' if len(held) > 5 else ''}); give --out a new or empty directory (nothing "
                             "there is replaced)")
    return out


def tuned_dir(base: Path, env: str) -> Path:
    """Where `libra policy tune` writes `base` tuned on `env` unless told: the base's directory
    suffixed with the environment (`.libra/policy` -> `.libra/policy-math`)."""
    return base.with_name(f"{base.name}-{env}")


@dataclass(frozen=True)
class TuneSettings:
    """Continued supervision of a built policy (`tune_policy`): `demonstrations` of the `env` expert's
    on fresh tasks (seed TUNE_TASK_SEED + `seed`; none the same problem as one of the first
    `held_out` held-out tasks), each seen once, one AdamW update (constant rate `lr`, no weight
    decay, the gradient clipped to norm 1) per `batch` of them, in the tasks' order."""
    env: str = "math"
    demonstrations: int = 4800
    batch: int = 64
    lr: float = 1e-3
    seed: int = 0
    held_out: int = 1024  # 8x the main job's evaluation

    def __post_init__(self) -> None:
        if self.env not in ENVS:
            raise LibraError(f"unknown environment {self.env!r}; environments: {', '.join(ENVS)}")
        if not 1 <= self.batch <= self.demonstrations:
            raise LibraError(f"tuning needs at least one batch: {self.demonstrations} demonstrations in batches of "
                             f"{self.batch}; give at least {max(1, self.batch)} demonstrations and a batch of at least 1")
        if not 0 < self.lr <= 1:
            raise LibraError(f"tuning's learning rate {self.lr} must be in (0, 1]")
        if self.held_out < 0:
            raise LibraError(f"tuning's held_out {self.held_out} must be >= 0 (the held-out tasks whose problems it leaves out)")

    @property
    def updates(self) -> int:
        return self.demonstrations // self.batch


def tune_policy(out: str | Path, base: str | Path, settings: TuneSettings = TuneSettings(), log=print,
                progress: Callable[[int, int, float], None] | None = None,
                sandbox: SandboxConfig | None = None, rebuild: bool = False) -> dict:
    """The policy in `base` after continued supervision with `settings`, written to `out`; its record.
    Unless `rebuild`, a policy in `out` tuned from these weights with these settings is kept, and the
    shipped tuned policy is copied when it was. `progress` hears (updates done, updates, the loss)."""
    out, base = Path(out), Path(base)
    if (missing := missing_policy(base, "the policy to tune")) is not None:
        raise LibraError(missing)
    if not (base / "model.safetensors").is_file():
        raise LibraError(f"the policy to tune, {base}: no model.safetensors beside its config.json; tuning takes a policy "
                         "`libra policy init` or `libra policy tune` wrote")
    if out.resolve() == base.resolve():
        raise LibraError(f"tuning writes a new policy: give --out a directory other than its base {base}")
    tuned = {"base_sha256": _sha256(base / "model.safetensors"), "settings": json.loads(json.dumps(asdict(settings)))}
    out = _policy_out(out, tuned=True)  # before any work: tuning replaces `out` whole
    if not rebuild:
        if (record := _record_if_tuned_as(out, tuned)) is not None:
            log(f"policy in {out} is up to date (tuned in {record['train_s']:.0f} s, final loss {record['final_loss']:.3f})")
            return record
        shipped = SHIPPED_TUNED.get(settings.env)
        if shipped is not None and (record := _record_if_tuned_as(shipped, tuned)) is not None \
                and out.resolve() != shipped.resolve():
            out.mkdir(parents=True, exist_ok=True)
            for name in POLICY_FILES:  # the record last: it marks a whole copy
                shutil.copyfile(shipped / name, out / name)
            log(f"policy in {out}: copied the shipped tuned policy (final loss {record['final_loss']:.3f})")
            return record
    from transformers import AutoModelForCausalLM, AutoTokenizer

    build = Stopwatch()
    tokenizer = AutoTokenizer.from_pretrained(base)
    env = make_env(settings.env, sandbox)
    examples = []
    for task in fresh_tasks(env, settings.updates * settings.batch, TUNE_TASK_SEED + settings.seed, settings.held_out,
                            "give a smaller --held-out (fewer held-out problems to keep apart)"):
        with temporary_workroot("libra-tune-") as workdir:
            examples.append(encode(tokenizer, *demonstration(env, task, workdir)))
    longest = max(len(ids) for ids, _ in examples)
    positions = json.loads((base / "config.json").read_text()).get("max_position_embeddings", longest)
    if longest > positions:
        raise LibraError(f"a demonstration has {longest} tokens, more than the policy's {positions} positions")
    torch.manual_seed(settings.seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).train()
    optimizer = make_optimizer(model.parameters(), settings.lr, weight_decay=0.0)
    losses = []
    for update in range(settings.updates):
        losses.append(supervised_step(model, optimizer, examples[update * settings.batch:(update + 1) * settings.batch]))
        if progress:
            progress(update + 1, settings.updates, losses[-1])
    staging = out.with_name(f".{out.name}.tuning")  # written whole, then put in place of an earlier tuning's
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(base / name, staging / name)
    record = {"tuned": tuned, "base": _record_or_none(base), "parameters": sum(p.numel() for p in model.parameters()),
              "demonstrations": len(examples), "longest_tokens": longest, "train_s": build.seconds(),
              "final_loss": sum(losses[-5:]) / len(losses[-5:])}
    (staging / "libra_policy.json").write_text(json.dumps(record, indent=2))
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return record


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _record_or_none(directory: Path) -> dict | None:
    """The policy's build record (`libra_policy.json`), None without one; a LibraError when it is not
    a record."""
    path = directory / "libra_policy.json"
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LibraError(f"{path} is not a policy's record ({first_line(exc)}); build the policy again "
                         "(`libra policy init` or `libra policy tune`) or give another") from None
    if not isinstance(record, dict):
        raise LibraError(f"{path} is not a policy's record (not a JSON object); build the policy again "
                         "(`libra policy init` or `libra policy tune`) or give another")
    return record


def tuned_apart(directory: Path, env: str) -> int | None:
    """How many of `env`'s held-out tasks the policy in `directory` was tuned apart from (their
    problems left out of its demonstrations), None when it was not tuned on `env`."""
    tuned = (_record_or_none(directory) or {}).get("tuned")
    settings = tuned.get("settings") if isinstance(tuned, dict) else None
    if not isinstance(settings, dict) or settings.get("env") != env or not isinstance(settings.get("held_out"), int):
        return None
    return settings["held_out"]


def _record_if_tuned_as(directory: Path, tuned: dict) -> dict | None:
    record = _record_or_none(directory)
    return record if record is not None and record.get("tuned") == tuned else None
