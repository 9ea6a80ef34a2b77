"""LoRA Ensembles (Wang et al., 2023; Mühlematter et al., 2024): E low-rank adapters on one
frozen model, each fine-tuned with its own seed.

Each member is the trained model with ``peft`` LoRA adapters on its attention's linear layers (a
timm ViT's ``attn.qkv`` and ``attn.proj``, a BERT-family encoder's ``attention.self.query/key/
value`` and ``attention.output.dense``: every ``nn.Linear`` under an ``attn`` or ``attention``
module), rank r = 4 and alpha = 8 as in the paper: a layer's weight becomes
``W + B A * alpha / r``, B starting at zero (the member starts as the model) and A drawn from
the member's seed. The adapters alone are trained; the seed also orders the batches. The
ensemble keeps one copy of the model and the E adapters (``peft``'s named adapters), and runs
one forward per member.
"""

from __future__ import annotations

import copy

import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from torch import nn

from hydra_core.evaluate import callable_model

RANK, ALPHA = 4, 8
_ATTENTION = ("attn", "attention")


def attention_linears(model: nn.Module) -> list[str]:
    """The names of the linear layers inside the model's attention modules (where the adapters
    go); a ValueError when there is none."""
    names = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and any(p in _ATTENTION for p in name.split(".")[:-1])
    ]
    if not names:
        raise ValueError("LoRA Ensembles: the model has no linear layer inside an attention module")
    return names


def lora_config(model: nn.Module, rank: int = RANK, alpha: float = ALPHA) -> LoraConfig:
    """The adapters' configuration: rank, alpha, the attention's linear layers, no dropout."""
    return LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=attention_linears(model), lora_dropout=0.0
    )


def lora_member(model: nn.Module, seed: int, rank: int = RANK, alpha: float = ALPHA):
    """A copy of ``model`` with fresh LoRA adapters (A drawn with ``seed``, the caller's random
    state untouched; B zero): a ``peft`` model whose trainable parameters are the adapters."""
    config = lora_config(model, rank, alpha)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return get_peft_model(copy.deepcopy(model).cpu(), config)


def adapter_state(member) -> dict[str, torch.Tensor]:
    """A member's adapter weights (what its training changed), by peft's names."""
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(member).items()}


class LoRAEnsemble(nn.Module):
    """One copy of ``model`` with the members' adapters; ``forward(inputs)`` -> (B, E, classes),
    member m's logits with adapter m alone active."""

    def __init__(
        self, model: nn.Module, adapters: list[dict], rank: int = RANK, alpha: float = ALPHA
    ) -> None:
        super().__init__()
        if not adapters:
            raise ValueError("LoRA Ensembles need at least one adapter")
        config = lora_config(model, rank, alpha)
        self.names = [f"member{m}" for m in range(len(adapters))]
        peft_model = get_peft_model(copy.deepcopy(model).cpu(), config, adapter_name=self.names[0])
        for name in self.names[1:]:
            peft_model.add_adapter(name, config)
        for name, state in zip(self.names, adapters, strict=True):
            set_peft_model_state_dict(peft_model, state, adapter_name=name)
        self.peft_model = peft_model.eval()
        self.tuner = peft_model.base_model  # LoraModel: set_adapter picks the active member
        self.call = callable_model(self.tuner.model)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        outs = []
        for name in self.names:
            self.tuner.set_adapter(name)
            outs.append(self.call(inputs))
        return torch.stack(outs, dim=1)
