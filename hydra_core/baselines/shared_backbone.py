"""Deep Ensembles (D) for text models, the paper's text baseline: one fine-tuned backbone and M
classifiers from different seeds. The members share the embedding and the blocks their training
froze (the same parameter objects, run once per batch: :class:`SharedBackboneEnsemble`).

Two ways to make them: :func:`train_text_ensemble` (``minilm-sentiment``: its own ``train-text``
recipe once per seed, the shipped model being seed 0) and :func:`deep_heads` (any text
classifier: fresh heads trained on the shared encoder's final states).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import asdict

import torch
from torch import nn

from hydra_core.cache import DiskCache, cache_key, model_fingerprint
from hydra_core.data.images import take
from hydra_core.data.text import TextSet
from hydra_core.models.adapter import family_of
from hydra_core.training.prefix import StateBatch, state_batches, trained_parameters
from hydra_core.training.top import TopFinetuneConfig, TopFinetuned, finetune_copy, unstamped
from hydra_core.types import Log, StageProgress

#: the system's name in the reports (the paper's "Deep Ensembles (D)")
DEEP = "Deep Ensembles (D)"
#: Deep Ensembles (D): fresh heads on the shared encoder, train-text's recipe (3 epochs, the
#: epoch of best validation NLL kept) at a learning rate for a head trained from scratch
DEEP_HEADS = TopFinetuneConfig(trained_layers=0, epochs=3, lr=1e-3, n_train=None, reinit_head=True)


class SharedBackboneEnsemble(nn.Module):
    """Deep Ensembles (D): M copies of one model that share its embedding and its first
    ``shared`` blocks (the same parameters, stored once); ``forward(packed)`` -> (B, M, C).

    The shared blocks run once; each copy runs its own blocks from ``shared`` on and its head.
    """

    def __init__(self, copies: Sequence[nn.Module], shared: int) -> None:
        super().__init__()
        self.copies = nn.ModuleList(copies)
        self.shared = shared

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        first = self.copies[0]
        family = family_of(first)
        x, context = family.embed(first, family.prepare(first, inputs))
        for block in family.blocks(first)[: self.shared]:
            x = family.block_forward(block, x, context)
        logits = []
        for member in self.copies:
            h = x
            for block in family.blocks(member)[self.shared :]:
                h = family.block_forward(block, h, context)
            logits.append(family.classify(member, h, context))
        return torch.stack(logits, dim=1)  # (B, M, C)


def sharing_copy(model: nn.Module, shared: int) -> nn.Module:
    """A copy of ``model`` that shares its embedding and first ``shared`` blocks with it (the
    same parameter objects) and has its own copy of the blocks above and of the head."""
    own = {id(p) for p in trained_parameters(model, shared).values()}
    memo = {id(p): p for p in model.parameters() if id(p) not in own}
    return unstamped(copy.deepcopy(model, memo=memo))


def deep_heads(
    model: nn.Module,
    train_set: TextSet,
    config: TopFinetuneConfig,
    *,
    preprocess: Callable[[Sequence[str]], torch.Tensor],
    seeds: Sequence[int],
    validation_set: TextSet | None = None,
    device: str | torch.device = "cpu",
    cache: DiskCache | None = None,
    progress: StageProgress | None = None,
) -> tuple[SharedBackboneEnsemble, list[TopFinetuned]]:
    """Deep Ensembles (D) on any text classifier: one fresh head per seed (re-initialised, then
    trained on the final states of ``model``'s encoder, computed once and only when some head
    is not cached) on the shared encoder."""
    if config.trained_layers != 0 or not config.reinit_head:
        raise ValueError(
            "Deep Ensembles' heads train the head alone on the shared encoder: pass a config "
            "with trained_layers=0 and reinit_head=True"
        )
    device = torch.device(device)
    model = model.to(device).eval()
    layers = len(family_of(model).blocks(model))
    kept: list[list[StateBatch]] = []

    def states() -> list[StateBatch]:
        if not kept:
            data = take(train_set, config.n_train, purpose="text-finetune")
            kept.append(state_batches(model, preprocess, data, layers, config.batch_size, device))
        return kept[0]

    heads = []
    for seed in seeds:
        report = (
            None if progress is None else (lambda d, t, s=seed: progress(f"{DEEP} head {s}", d, t))
        )
        heads.append(
            finetune_copy(
                sharing_copy(model, layers),
                (model_fingerprint(model), "shared encoder"),
                train_set,
                config,
                preprocess,
                validation_set,
                seed,
                f"head seed {seed}",
                states,
                device,
                cache,
                report,
            )
        )
    return SharedBackboneEnsemble([h.model for h in heads], layers), heads


#: part of the cache key of the train-text copies Deep Ensembles (D) uses
TRAIN_TEXT_CACHE_KIND = "train-text-copy"


def has_train_text_recipe(model_name: str) -> bool:
    """True when Deep Ensembles (D) of this model can be :func:`train_text_ensemble` (its own
    ``train-text`` recipe once per seed): ``minilm-sentiment`` alone; any other text model gets
    fresh heads on its shared encoder (:func:`deep_heads`)."""
    from hydra_core.zoo.named import named_model

    named = named_model(model_name)
    return named is not None and named.recipe is not None and named.recipe.copies


def train_text_ensemble(
    model: nn.Module,
    seeds: Sequence[int],
    *,
    cache: DiskCache | None = None,
    log: Log = print,
    progress: StageProgress | None = None,
) -> tuple[SharedBackboneEnsemble, list[dict]]:
    """Deep Ensembles (D) for ``minilm-sentiment``: its own ``train-text`` recipe run once per
    seed, the shipped model being seed 0. The runs share what the recipe freezes (the wheel's
    embedding and lower encoder layers, checked equal here) and differ in what it trains (the
    top layers, pooler and classifier: initialisation of the classifier, batch order and dropout
    by seed); the trained tensors are rounded to float16 as the shipped asset stores them.
    Returns the ensemble and, per seed, the run's header (validation and test accuracy)."""
    from hydra_core.zoo.minilm import TextTrainConfig, read_asset_header, train_minilm

    shipped = read_asset_header()
    frozen = shipped["num_layers"] - len(shipped["trained_layers"])
    recipe = {k: v for k, v in shipped["train_config"].items() if k != "seed"}
    copies, headers = [], []
    for seed in seeds:
        if seed == shipped["train_config"]["seed"]:
            copies.append(model)
            headers.append(_run_row(seed, shipped, cached=True, shipped=True))
            continue
        config = TextTrainConfig(**recipe, seed=seed)
        key = cache_key(TRAIN_TEXT_CACHE_KIND, model_fingerprint(model), asdict(config))
        stored = None if cache is None else cache.load(TRAIN_TEXT_CACHE_KIND, key)
        cached = isinstance(stored, dict)
        if not cached:
            report = (
                None
                if progress is None
                else (lambda d, t, s=seed: progress(f"train-text seed {s}", d, t))
            )
            trained, header = train_minilm(config, log=log, progress=report)
            wrapped = family_of(trained).callable_model(trained)
            names = set(trained_parameters(wrapped, frozen))
            state = wrapped.state_dict()
            source = model.state_dict()
            if any(not torch.equal(v, source[k].cpu()) for k, v in state.items() if k not in names):
                raise ValueError(
                    f"train-text seed {seed} changed a layer the recipe freezes; the members "
                    "cannot share it"
                )
            state = {k: v.half() for k, v in state.items() if k in names}
            stored = {"state": state, "header": header}
            if cache is not None:
                cache.save(TRAIN_TEXT_CACHE_KIND, key, stored)
        twin = sharing_copy(model, frozen)
        twin.load_state_dict({k: v.float() for k, v in stored["state"].items()}, strict=False)
        copies.append(twin)
        headers.append(_run_row(seed, stored["header"], cached=cached))
    return SharedBackboneEnsemble(copies, frozen), headers


def _run_row(seed: int, header: dict, cached: bool, shipped: bool = False) -> dict:
    """A train-text run as a row of the training table (its header's accuracies and time)."""
    return {
        "system": DEEP,
        "model": f"train-text seed {seed}" + (" (the shipped model)" if shipped else ""),
        "seed": seed,
        "chosen_epoch": header["chosen_epoch"],
        "validation_accuracy": header["validation_accuracy"],
        "validation_nll": header["validation_nll"],
        "test_accuracy": header["test_accuracy"],
        "seconds": header["train_seconds"],
        "cached": cached,
    }
