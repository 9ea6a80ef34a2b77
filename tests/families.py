"""The model families the contract suites run on, one :class:`Family` per tiny model of
``tests/conftest.py``: timm ViTs (each of ``TINY_CONFIGS``), Hugging Face text classifiers (each
of ``TEXT_KINDS``) and OpenCLIP image towers (each of ``CLIP_VARIANTS``).

A contract test takes the ``family`` fixture (``tests/conftest.py``) and speaks only through this
interface: build the model, make a batch, run a model on it, and the plain reference of a member
(the model with some heads removed, computed the family's own way). Adding a family to every
contract is one more entry in :func:`family_for` and its ids in ``conftest.FAMILY_IDS``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hydra_core.hydra import HydraText, fuse_members
from hydra_core.hydra.fused import HydraViT
from hydra_core.hydra.fused_clip import fuse_clip_members
from hydra_core.models.adapter import ablate
from tests.conftest import (
    CLIP_VARIANTS,
    TINY_CONFIGS,
    clip_images,
    make_tiny_clip,
    make_tiny_text,
    make_tiny_vit,
    random_mask,
    text_batch,
)

DEPTH, HEADS = 3, 4  # every family's tiny model: 3 layers of 4 heads
#: Hugging Face text blocks' MLP parameters, by their names
TEXT_MLP = r"layer\.(\d+)\.(intermediate\.dense|output\.dense|ffn\.lin1|ffn\.lin2)\."


@dataclass(frozen=True)
class Family:
    """One tiny model of a family, as the contract suites see it.

    Attributes:
        id: the pytest id, ``<family>-<configuration>``.
        name: the family: ``vit``, ``text`` or ``openclip``.
        build: ``build(**overrides)`` gives the model in eval mode (``seed``; ``scale`` where the
            family's builder scales its weights up).
        batch: ``batch(seed)`` gives an input batch of :attr:`batch_size` items.
        outputs: the size of the last axis of the model's output (classes, or embedding size).
        hydra_type: the class :func:`fuse_members` builds for this family.
        fuse: the fusing function the family's own tests call.
        mlp: a regular expression matching the names of the blocks' MLP parameters.
        header: the fields a saved Hydra's header holds for this family (format, version, ...).
        grouped: attributes of a Hydra of three fine-tuned members held once per member.
        fine_tune: what each of three fine-tuned members nudges (``None``: the model unchanged;
            else a regular expression over parameter names, ``""`` for every parameter).
        low_scale: ``build`` keywords for weights small enough that bfloat16 stays close.
        classes: class names to save with a Hydra, or None.
        reference: how the plain reference removes heads (see :meth:`ablated`).
        wo: a regular expression matching the name of each block's W_O weight, its group 1 the
            layer.
        head_dim, embed_dim: d_k and d.
        search_data: ``search_data()`` gives a search's (id_x, id_y, ood_x): 24 ID items with
            labels, 24 OOD items.
    """

    id: str
    name: str
    build: Callable[..., torch.nn.Module]
    batch: Callable[[int], object]
    batch_size: int
    outputs: int
    hydra_type: type
    fuse: Callable
    mlp: str
    header: dict
    grouped: tuple[str, ...]
    fine_tune: tuple[str | None, ...] = ("", "", "")
    low_scale: dict = field(default_factory=dict)
    classes: tuple[str, ...] | None = None
    reference: str = "hooks"
    wo: str = ""
    head_dim: int = 6
    embed_dim: int = 24
    search_data: Callable[[], tuple] | None = None

    def run(self, model: torch.nn.Module, batch) -> torch.Tensor:
        """The model's (or a Hydra's) output on ``batch``: logits, or a tower's embeddings."""
        if self.name != "text":
            return model(batch)
        ids, mask = batch
        out = model(input_ids=ids, attention_mask=mask)
        return getattr(out, "logits", out)

    @property
    def model_family(self):
        """The engine's family object the model is read through."""
        from hydra_core.models.openclip import OPENCLIP
        from hydra_core.models.text import TEXT
        from hydra_core.models.vit import VIT

        return {"vit": VIT, "text": TEXT, "openclip": OPENCLIP}[self.name]

    def inputs(self, batch) -> torch.Tensor:
        """``batch`` as the engine's functions take it (text: ids and mask packed)."""
        if self.name != "text":
            return batch
        from hydra_core.models.text import pack

        return pack(*batch)

    def zeroed(self, model: torch.nn.Module, keep: torch.Tensor) -> torch.nn.Module:
        """The paper's definition of ablation, written out: a copy of ``model`` with each removed
        head's column block of W_O set to zero."""
        model = copy.deepcopy(model)
        dk = self.head_dim
        with torch.no_grad():
            for name, weight in model.named_parameters():
                if match := re.search(self.wo, name):
                    layer = int(match.group(1))
                    for head in (~keep[layer]).nonzero().flatten().tolist():
                        weight[:, head * dk : (head + 1) * dk] = 0
        return model

    def ablated(self, model: torch.nn.Module, keep: torch.Tensor, batch) -> torch.Tensor:
        """The plain reference of a member: ``model`` with the heads ``keep`` leaves out removed.

        ViTs and text models switch the heads off with :func:`ablate` (its hooks are checked
        against :meth:`zeroed` in tests/models/test_family_contract.py); OpenCLIP towers are run
        as :meth:`zeroed` copies."""
        if self.reference == "zeroed":
            return self.run(self.zeroed(model, keep), batch)
        with ablate(model, keep):
            return self.run(model, batch)


def member_masks(seed: int = 0) -> list[torch.Tensor]:
    """Three different (3, 4) masks with unequal head counts; member 1 keeps no head in layer 1,
    member 2 every head of layer 2."""
    masks = [random_mask((DEPTH, HEADS), seed + i) for i in range(3)]
    masks[0][:, 0] = True  # at least one head somewhere, so layers are not all empty
    masks[1][1] = False
    masks[2][2] = True
    return masks


def perturbed_copy(model: torch.nn.Module, seed: int, scale: float = 0.05, only: str = ""):
    """A stand-in for a fine-tuned member: every parameter whose name matches ``only`` (a
    regular expression; ``""`` matches all) nudged."""
    member = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in member.named_parameters():
            if re.search(only, name):
                p.add_(scale * torch.randn(p.shape, generator=g) * p.abs().mean())
    return member


def with_merged_mlps(members: list[torch.nn.Module], mlp: str) -> list[torch.nn.Module]:
    """The plain reference for fine-tuned fusion: each member with every block's MLP parameters
    (names matching ``mlp``) replaced by the members' mean."""
    out = [copy.deepcopy(m) for m in members]
    params = [dict(m.named_parameters()) for m in members]
    with torch.no_grad():
        for name in params[0]:
            if re.search(mlp, name):
                mean = torch.stack([p[name] for p in params]).mean(0)
                for m in out:
                    m.get_parameter(name).copy_(mean)
    return out


def tiny_bert(**overrides):
    """A tiny random BERT classifier (2 layers of 4 heads, d=24) with ``overrides`` in its
    Hugging Face config."""
    import transformers

    torch.manual_seed(0)
    config = dict(
        vocab_size=60,
        max_position_embeddings=40,
        num_labels=3,
        pad_token_id=1,
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
    )
    config.update(overrides)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(**config))
    return model.eval()


def _images(seed: int) -> torch.Tensor:
    return torch.randn(8, 1, 16, 16, generator=torch.Generator().manual_seed(seed))


def _image_search_data(shape: tuple[int, ...], classes: int, seed: int = 0):
    """Random ID images with random labels, and brighter OOD images (24 each)."""
    g = torch.Generator().manual_seed(seed)
    id_x = torch.randn(24, *shape, generator=g)
    id_y = torch.randint(0, classes, (24,), generator=g)
    ood_x = 1.5 * torch.randn(24, *shape, generator=g) + 0.5
    return id_x, id_y, ood_x


def _text_search_data(seed: int = 1, n: int = 24):
    """Ragged ID texts with labels, and longer OOD texts (padded to 14 tokens), packed."""
    from hydra_core.models.text import pack

    ids, mask = text_batch(seed=seed, batch=n, tokens=10)
    ood_ids, ood_mask = text_batch(seed=seed + 100, batch=n, tokens=14)
    return pack(ids, mask), torch.arange(n) % 3, pack(ood_ids, ood_mask)


def _vit(config: str) -> Family:
    def build(seed: int = 0, scale: float = 4.0, **overrides):
        return make_tiny_vit(seed=seed, scale=scale, **{**TINY_CONFIGS[config], **overrides})

    return Family(
        id=f"vit-{config}",
        name="vit",
        build=build,
        batch=_images,
        batch_size=8,
        outputs=5,
        hydra_type=HydraViT,
        fuse=fuse_members,
        mlp=r"^blocks\.\d+\.mlp\.",
        header={"format": "hydra-fused", "version": 1},
        grouped=("stem", "head"),
        low_scale={"scale": 1.0},
        classes=("a", "b", "c", "d", "e"),
        wo=r"^blocks\.(\d+)\.attn\.proj\.weight$",
        search_data=lambda: _image_search_data((1, 16, 16), 5),
    )


def _text(kind: str) -> Family:
    def build(seed: int = 0, scale: float = 3.0, **overrides):
        """A tiny random classifier whose output layer is scaled up, so that its logits are of
        order 1 and a 1e-5 comparison is a strict one."""
        model = make_tiny_text(kind, seed=seed, depth=DEPTH, scale=scale, **overrides)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in ("classifier.weight", "classifier.out_proj.weight"):
                    p.mul_(20)
        return model

    return Family(
        id=f"text-{kind}",
        name="text",
        build=build,
        batch=lambda seed: text_batch(seed=seed),
        batch_size=6,
        outputs=3,
        hydra_type=HydraText,
        fuse=fuse_members,
        mlp=TEXT_MLP,
        header={"format": "hydra-fused-text", "version": 1, "kind": kind},
        grouped=("embeddings", "classifier", "blocks.0.norm1"),
        # one member as it is, one with its blocks and norms nudged, one with everything nudged
        # (embeddings, position bias, classifier too)
        fine_tune=(None, r"layer\.|LayerNorm|layer_norm", ""),
        low_scale={"scale": 1.0},
        classes=("a", "b", "c"),
        wo=r"layer\.(\d+)\.attention\.(output\.dense|attn\.o|out_lin)\.weight$",
        search_data=_text_search_data,
    )


def _openclip(variant: str) -> Family:
    def build(seed: int = 0, **overrides):
        return make_tiny_clip(seed=seed, **{**CLIP_VARIANTS[variant], **overrides}).visual

    return Family(
        id=f"openclip-{variant}",
        name="openclip",
        build=build,
        batch=lambda seed: clip_images(seed=seed),
        batch_size=6,
        outputs=32,  # the tower's embedding size
        hydra_type=HydraViT,
        fuse=fuse_clip_members,
        mlp=r"^transformer\.resblocks\.\d+\.mlp\.",
        header={"format": "hydra-fused", "version": 1},
        grouped=("stem",),
        reference="zeroed",
        wo=r"^transformer\.resblocks\.(\d+)\.attn\.out_proj\.weight$",
        head_dim=16,
        embed_dim=64,
        search_data=lambda: _image_search_data((3, 32, 32), 32),
    )


def family_for(family_id: str) -> Family:
    """The :class:`Family` of a ``conftest.FAMILY_IDS`` entry."""
    name, config = family_id.split("-", 1)
    return {"vit": _vit, "text": _text, "openclip": _openclip}[name](config)
