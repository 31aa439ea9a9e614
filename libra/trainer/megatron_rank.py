"""One rank of the megatron-core trainer: its shard of the policy as a `GPTModel`, trained with
megatron's own pipeline schedule and data-parallel gradient reduction. Every rank of the layout runs
the same calls in the same order (SPMD); `libra.trainer.megatron_trainer` starts the ranks and
drives them.

The layout is `tp` x `pp` x `dp` ranks (megatron's order: TP fastest, then DP, then PP). A step's
samples are split over the data-parallel replicas as the torch trainer splits them over its ranks
(replica d takes samples d, d + DP, ...), packed into the same micro-batches (`micro_batch_tokens`),
and each micro-batch goes through the pipeline as one of megatron's micro-batches. The loss of a
micro-batch is the sum of GRPO's per-token loss over its policy tokens, returned with their count
(`calculate_per_token_loss`): megatron sums the gradients over the micro-batches and replicas and
divides by the step's token count, which is the token mean the torch trainer takes. The update is
the trainer's (`take_update`: the schedule's learning rate, the global-norm clip, AdamW), the norm
counting each element once over the shards. The logits are gathered over the TP ranks (the whole
vocabulary on every TP rank of the last stage, as one process has it) and the padding rows of the
vocabulary dropped, so the loss is the torch trainer's to rounding.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from libra.config import TrainerConfig
from libra.errors import LibraError
from libra.trainer.layout import Layout
from libra.trainer.megatron_convert import Architecture, Sharding, to_hf, to_megatron
from libra.trainer.samples import MicroBatch, TrainingSample, collate, micro_batches
from libra.trainer.step import GRPOStep
from libra.trainer.trainer import AppliedUpdate, load_reference, take_update


def read_architecture(policy_dir: str | Path) -> Architecture:
    path = Path(policy_dir) / "config.json"
    try:
        return Architecture.from_hf_config(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError) as exc:
        raise LibraError(f"{path}: not an HF model config the megatron trainer can read ({exc})") from exc


def read_hf_weights(policy_dir: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(policy_dir).glob("*.safetensors"))
    if not files:
        raise LibraError(f"{policy_dir}: no *.safetensors weights (save the policy with safe_serialization)")
    out: dict[str, torch.Tensor] = {}
    for file in files:
        out |= {k: v.float() for k, v in load_file(str(file)).items()}
    return out


def save_hf(policy_dir: str | Path, weights: dict[str, torch.Tensor], directory: str | Path) -> None:
    """`weights` (HF names) as the HF model of `policy_dir`'s config, saved to `directory`
    (safetensors and config): what vLLM, transformers and the checkpoints load."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a rank's or a pool process's stderr is the run's
    config = AutoConfig.from_pretrained(policy_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(weights, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise LibraError(f"the megatron trainer's weights lack {missing[:3]}")
    model.save_pretrained(directory, safe_serialization=True)


def hf_parameter_names(policy_dir: str | Path) -> list[str]:
    """The HF model's parameters in `parameters()` order (a tied head once): the order of the torch
    trainer's optimizer state, which is the layout of a checkpoint's."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(policy_dir))
    return [name for name, _ in model.named_parameters()]


def transformer_config(arch: Architecture, layout: Layout, device: torch.device):
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=arch.layers, hidden_size=arch.hidden, num_attention_heads=arch.heads,
        num_query_groups=arch.kv_heads, kv_channels=arch.head_dim, ffn_hidden_size=arch.ffn,
        normalization="RMSNorm", layernorm_epsilon=arch.norm_eps, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=arch.qkv_bias, attention_dropout=0.0, hidden_dropout=0.0,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
        persist_layer_norm=False, gradient_accumulation_fusion=False, attention_softmax_in_fp32=True,
        params_dtype=torch.float32, pipeline_dtype=torch.float32, use_cpu_initialization=device.type == "cpu",
        perform_initialization=True,  # (False also skips marking the TP-sharded parameters)
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        calculate_per_token_loss=True, variable_seq_lengths=True, batch_p2p_comm=False,
        moe_token_dispatcher_type="alltoall")  # a dense model: only to pass the variable-length check


def gpt_model(arch: Architecture, layout: Layout, device: torch.device, first: bool = True, last: bool = True):
    """This rank's stage of the policy as megatron-core's `GPTModel` (local layer spec; megatron's
    parallel state initialised for `layout`), its parameters not loaded yet."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    tc = transformer_config(arch, layout, device)
    model = GPTModel(tc, get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=Sharding(layout.tp, layout.pp).padded_vocab(arch), max_sequence_length=arch.max_positions,
                     pre_process=first, post_process=last, parallel_output=False,
                     share_embeddings_and_output_weights=arch.tied, position_embedding_type="rope",
                     rotary_base=int(arch.rope_base)).to(device)
    return model, tc


def load_shard(model: torch.nn.Module, hf: dict[str, torch.Tensor], arch: Architecture, sharding: Sharding,
               tp_rank: int, stage: int) -> None:
    """Copy the HF weights' shard (`to_megatron`) into `model`'s parameters, each checked by name and shape."""
    mine = to_megatron(hf, arch, sharding, tp_rank, stage)
    params = dict(model.named_parameters())
    if params.keys() != mine.keys():
        raise LibraError(f"the converted weights do not match megatron's model: missing "
                         f"{sorted(params.keys() - mine.keys())}, extra {sorted(mine.keys() - params.keys())}")
    with torch.no_grad():
        for name, param in params.items():
            if param.shape != mine[name].shape:
                raise LibraError(f"{name}: megatron's shape {tuple(param.shape)}, converted {tuple(mine[name].shape)}")
            param.copy_(mine[name])


def moments_to_hf(state: dict, moments: dict[str, dict[tuple[int, int], dict[str, torch.Tensor]]], arch: Architecture,
                  sharding: Sharding, hf_order: list[str]) -> dict:
    """AdamW's state in the torch trainer's layout (HF parameter order, whole tensors) from one
    rank's optimizer `state` dict (its step and groups) and every shard's moments by megatron name
    (`moments[key][(tp_rank, stage)]`): a checkpoint of either backend resumes on the other."""
    groups = [{**group, "params": list(range(len(hf_order)))} for group in state["param_groups"]]
    if not state["state"]:  # no update yet
        return {"state": {}, "param_groups": groups}
    steps = {float(s["step"]) for s in state["state"].values()}
    if len(steps) != 1:
        raise RuntimeError(f"AdamW's parameters are at different steps {sorted(steps)}")
    step = steps.pop()
    whole = {k: to_hf(v, arch, sharding) for k, v in moments.items()}
    return {"state": {i: {"step": torch.tensor(step), "exp_avg": whole["exp_avg"][n], "exp_avg_sq": whole["exp_avg_sq"][n]}
                      for i, n in enumerate(hf_order)}, "param_groups": groups}


def moments_from_hf(state: dict, arch: Architecture, sharding: Sharding, tp_rank: int, stage: int, names: list[str],
                    hf_order: list[str], device: torch.device) -> dict:
    """The inverse of `moments_to_hf`: the torch trainer's optimizer state as the state dict of the
    optimizer over this rank's parameters (`names`, megatron's, in its order)."""
    if len(state["param_groups"]) != 1 or len(state["param_groups"][0]["params"]) != len(hf_order):
        raise LibraError(f"the optimizer state is not of this policy: {len(hf_order)} parameters expected")
    mine: dict[int, dict] = {}
    if state["state"]:
        shards = {}
        for key in ("exp_avg", "exp_avg_sq"):
            whole = {n: state["state"][i][key] for i, n in enumerate(hf_order)}
            shards[key] = to_megatron(whole, arch, sharding, tp_rank, stage)
        step = next(iter(state["state"].values()))["step"]
        mine = {j: {"step": step.clone(), "exp_avg": shards["exp_avg"][n].to(device),
                    "exp_avg_sq": shards["exp_avg_sq"][n].to(device)} for j, n in enumerate(names)}
    return {"state": mine, "param_groups": [{**state["param_groups"][0], "params": list(range(len(names)))}]}


def positions_and_mask(ids: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch's position ids and megatron's causal mask."""
    positions = torch.arange(ids.shape[1], device=device).unsqueeze(0).expand_as(ids)
    return positions, causal_mask(ids.shape[1], device)


def megatron_logits(output: torch.Tensor, arch: Architecture, temperature: float) -> torch.Tensor:
    """The logits at each target position from megatron's last-stage output, the vocabulary's
    padding rows dropped, scaled by the temperature."""
    return output[:, :-1, :arch.vocab] / temperature


def causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """Megatron's attention-mask convention: True where a query may not look (the future), [1, 1, T, T].
    Right padding needs nothing more: a real token never looks at the padding after it."""
    return torch.triu(torch.ones(length, length, dtype=torch.bool, device=device), diagonal=1)[None, None]


class MegatronRank:
    """This process's rank: megatron's parallel state initialised over the default process group
    (`dist.init_process_group` done by the caller), the policy's shard loaded from `policy_dir`."""

    def __init__(self, policy_dir: str | Path, config: TrainerConfig, layout: Layout, temperature: float,
                 device: torch.device, reference_dir: str | Path | None = None) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads

        from libra.optim import make_optimizer

        if device.type == "cpu":
            from libra.trainer.megatron_cpu import use_cpu

            use_cpu()
        self.config, self.layout, self.temperature, self.device = config, layout, temperature, device
        self.arch = read_architecture(policy_dir)
        self.sharding = Sharding(layout.tp, layout.pp)
        self.sharding.check(self.arch)
        if dist.get_world_size() != layout.world:
            raise LibraError(f"layout {layout} needs {layout.world} ranks; {dist.get_world_size()} are running")
        ps.initialize_model_parallel(tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp)
        self.ps = ps
        self.tp_rank, self.stage = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
        self.dp_rank = ps.get_data_parallel_rank()
        self.first, self.last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
        torch.manual_seed(config.seed)
        if device.type == "cuda":  # megatron's parallel layers draw their initialisation from its CUDA RNG
            # tracker (a data-parallel, a tensor-parallel and an expert stream), which must be seeded
            # after the parallel groups exist; on the CPU the shim makes its forks no-ops
            from megatron.core import tensor_parallel

            tensor_parallel.model_parallel_cuda_manual_seed(config.seed)
        self.model, tc = gpt_model(self.arch, layout, device, self.first, self.last)
        self.load_weights(read_hf_weights(policy_dir))
        self.ddp = DistributedDataParallel(tc, DistributedDataParallelConfig(overlap_grad_reduce=False,
                                                                             use_distributed_optimizer=False), self.model)
        tc.finalize_model_grads_func = finalize_model_grads
        tc.no_sync_func = self.ddp.no_sync
        self.names = [name for name, _ in self.model.named_parameters()]
        self.params = [p for _, p in self.model.named_parameters()]
        self.optimizer = make_optimizer(self.params, config.lr, config.weight_decay)
        self.reference = None
        if config.wants_reference and self.last:
            self.reference = load_reference(reference_dir or policy_dir, device)
        self.hf_order = hf_parameter_names(policy_dir)
        self.pad = self.arch.pad_token

    # -- weights in and out ----------------------------------------------------------------------

    def load_weights(self, hf: dict[str, torch.Tensor]) -> None:
        load_shard(self.model, hf, self.arch, self.sharding, self.tp_rank, self.stage)

    def _gathered(self, tensors: dict[str, torch.Tensor]) -> dict[tuple[int, int], dict[str, torch.Tensor]] | None:
        """Every model-parallel rank's `tensors` of replica 0, at global rank 0 (None elsewhere)."""
        mine = (self.tp_rank, self.stage, {k: v.detach().cpu() for k, v in tensors.items()}) if self.dp_rank == 0 else None
        gathered: list | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if gathered is None:
            return None
        return {(tp, stage): values for item in gathered if item is not None for tp, stage, values in [item]}

    def hf_weights(self) -> dict[str, torch.Tensor] | None:
        """The whole policy in HF names, at global rank 0 (collective: every rank calls it)."""
        shards = self._gathered(dict(self.model.named_parameters()))
        return None if shards is None else to_hf(shards, self.arch, self.sharding)

    def optimizer_state(self) -> dict | None:
        """AdamW's state in the torch trainer's layout (`moments_to_hf`), at global rank 0."""
        state = self.optimizer.state_dict()
        moments = {}
        for key in ("exp_avg", "exp_avg_sq"):
            moments[key] = self._gathered({n: state["state"][i][key] for i, n in enumerate(self.names)
                                           if i in state["state"]})
        if moments["exp_avg"] is None:
            return None
        return moments_to_hf(state, moments, self.arch, self.sharding, self.hf_order)

    def load_optimizer_state(self, state: dict) -> None:
        """The inverse of `optimizer_state` (the torch trainer's layout), onto this rank's shard."""
        self.optimizer.load_state_dict(moments_from_hf(state, self.arch, self.sharding, self.tp_rank, self.stage,
                                                       self.names, self.hf_order, self.device))

    # -- one update ------------------------------------------------------------------------------

    def train_step(self, samples: Sequence[TrainingSample], index: int) -> tuple[tuple[float, ...], int, AppliedUpdate]:
        """Update `index` (from 0) on the step's samples: (the step's `TALLIES` sums over every
        replica, the padded tokens this replica computed, the update applied)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        mine = list(samples[self.dp_rank::self.layout.dp])
        groups = micro_batches(mine, self.config.micro_batch_tokens)
        batches = [collate(g, self.pad) for g in groups] or [self._blank()]
        # every TP rank of the last stage has the same loss: its tallies counted once
        step = GRPOStep(self.config, self.temperature, self.device, self.reference, tallied=self.tp_rank == 0)
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad(set_to_none=True)
        get_forward_backward_func()(
            forward_step_func=partial(self._forward, step), data_iterator=iter(batches), model=[self.ddp],
            num_microbatches=len(batches), seq_length=max(b.input_ids.shape[1] for b in batches),
            micro_batch_size=max(b.input_ids.shape[0] for b in batches), forward_only=False)
        for param in self.params:
            param.grad = param.main_grad
        applied = take_update(self.model, self.optimizer, self.config, index, clip=self._clip)
        sums = step.sums
        dist.all_reduce(sums)
        padded = sum(b.input_ids.numel() for b in batches) if groups else 0
        return tuple(float(v) for v in sums), padded, applied

    def _blank(self) -> MicroBatch:
        """A replica without samples still takes part in the gradient reduction: one sequence of
        padding, no policy token."""
        return collate([TrainingSample("blank", "blank", (self.pad, self.pad), (0, 0), (0.0, 0.0), 0.0, 0.0, 0)],
                       self.pad)

    def _forward(self, step: GRPOStep, data_iterator, model):
        """Megatron's forward step: a micro-batch's output, and the loss function of it (last stage)."""
        batch = next(data_iterator)
        ids = batch.input_ids.to(self.device)
        positions, mask = positions_and_mask(ids, self.device)
        return model(ids, positions, attention_mask=mask), partial(self._loss, step, batch)

    def _loss(self, step: GRPOStep, batch: MicroBatch, output: torch.Tensor):
        """The micro-batch's summed loss and its policy-token count; megatron back-propagates it."""
        logits = megatron_logits(output, self.arch, self.temperature)
        loss, mask = step.loss(batch, logits, step.reference_logits(batch))
        return loss, mask.sum().to(torch.int), {}

    def _clip(self, max_norm: float) -> float:
        """Clip to `max_norm` by the norm of the whole gradient: each element once over the TP shards
        (a replicated norm weight on TP rank 0 only) and the PP stages (a tied embedding's copy on the
        last stage not again)."""
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        counted = [p.grad for p in self.params
                   if p.grad is not None and param_is_not_tensor_parallel_duplicate(p) and not getattr(p, "shared", False)]
        square = torch.zeros((), dtype=torch.float32, device=self.device)
        for grad in counted:
            square += grad.float().norm() ** 2
        dist.all_reduce(square, group=self.ps.get_model_parallel_group())
        norm = float(square.sqrt())
        coefficient = min(1.0, max_norm / (norm + 1e-6))
        for param in self.params:
            if param.grad is not None:
                param.grad.mul_(coefficient)
        return norm
