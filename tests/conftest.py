"""Shared fixtures: tiny timm ViTs in every configuration the adapter supports, built fast."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer

from hydra_core.zoo.default import VitConfig, build_vit, save_checkpoint

# Tiny models gain nothing from threads, and OpenMP threads that spin-wait for a busy core slow
# every small op down badly on a loaded 2-core machine.
torch.set_num_threads(1)


#: The files whose few tests take longest (a minute or more on a CI core: a real browser, spawned
#: processes, the docs' example, a report). ``make test`` splits the suite over two workers a file
#: at a time in collection order (``--dist loadfile --no-loadscope-reorder``); a long file that
#: came last would leave one worker running it alone, so these go first and the other files
#: follow, those with more tests first.
SLOWEST_FILES = (
    "tests/e2e/test_browser.py",
    "tests/test_distributed.py",
    "tests/docs/test_docs.py",
    "tests/report/test_report.py",
    "tests/cli/test_bad_inputs.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    """Collect the slowest files first, then the others by their number of tests (most first);
    within a file, the collection's own order."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def rank(name: str) -> tuple:
        first = SLOWEST_FILES.index(name) if name in SLOWEST_FILES else len(SLOWEST_FILES)
        return first, -len(files[name])

    items[:] = [item for name in sorted(files, key=rank) for item in files[name]]


def missing_data(reason: str) -> None:
    """Skip a test whose data files are not installed on this machine; fail it under CI
    (``CI`` set), where ``make setup`` installs every data file, so a missing one is a bug."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"data missing under CI: {reason}")
    pytest.skip(reason, allow_module_level=True)


#: timm configurations every model transform is checked on (qkv bias or not, layer scale,
#: token or average pooling, no class token, register tokens, no_embed_class).
TINY_CONFIGS = {
    "token-bias": dict(qkv_bias=True),
    "token-nobias": dict(qkv_bias=False),
    "layerscale": dict(init_values=0.5),
    "avgpool": dict(global_pool="avg"),
    "avg-noclass": dict(global_pool="avg", class_token=False),
    "registers-noembedclass": dict(reg_tokens=2, no_embed_class=True, init_values=0.3),
}


def make_tiny_vit(
    seed: int = 0, depth: int = 3, num_heads: int = 4, scale: float = 4.0, **overrides
) -> VisionTransformer:
    """A tiny random ViT (16x16x1 input, 4x4 patches, d=24) in eval mode.

    timm's initialisation gives near-zero weights, so nearly every head would be inert; the
    weights are scaled up by ``scale`` so that removing a head changes the logits noticeably."""
    torch.manual_seed(seed)
    kwargs = dict(
        img_size=16,
        patch_size=4,
        in_chans=1,
        num_classes=5,
        embed_dim=24,
        depth=depth,
        num_heads=num_heads,
        mlp_ratio=2.0,
        qkv_bias=True,
        global_pool="token",
    )
    kwargs.update(overrides)
    model = VisionTransformer(**kwargs)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2 or "bias" in name:
                p.mul_(scale)
    return model.eval()


@pytest.fixture(params=sorted(TINY_CONFIGS), ids=sorted(TINY_CONFIGS))
def tiny_vit(request) -> VisionTransformer:
    return make_tiny_vit(**TINY_CONFIGS[request.param])


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(8, 1, 16, 16, generator=torch.Generator().manual_seed(1))


def random_mask(shape: tuple[int, int], seed: int, p_keep: float = 0.6) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < p_keep


#: The architecture of the tiny Hydra Lab checkpoints the CLI, report and app tests load by path.
TINY = VitConfig(embed_dim=24, depth=2, num_heads=4, mlp_ratio=2.0)  # 2 x 4 = 8 heads


def write_tiny_checkpoint(path, config: VitConfig = TINY, seed: int = 0) -> str:
    """A tiny default-architecture checkpoint (28 px, 10 classes) saved at ``path``."""
    torch.manual_seed(seed)
    model = build_vit(config)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # timm's init is nearly inert; bigger weights make heads matter
    save_checkpoint(model, path, config)
    return str(path)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> str:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny.safetensors")


#: Hugging Face text classifiers every text transform is checked on (BERT-family encoders).
TEXT_KINDS = ("bert", "roberta", "mpnet", "distilbert")


def make_tiny_text(
    kind: str = "bert",
    seed: int = 0,
    depth: int = 2,
    num_heads: int = 4,
    scale: float = 3.0,
    num_labels: int = 3,
):
    """A tiny random Hugging Face sequence classifier (vocabulary 60, d=24, 3 classes by
    default), in eval mode, with its weights scaled up so that removing a head changes the logits
    noticeably."""
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=60, max_position_embeddings=40, num_labels=num_labels, pad_token_id=1)
    if kind == "distilbert":
        config = transformers.DistilBertConfig(
            dim=24, n_layers=depth, n_heads=num_heads, hidden_dim=48, **common
        )
        model = transformers.DistilBertForSequenceClassification(config)
    else:
        config_cls, model_cls = {
            "bert": (transformers.BertConfig, transformers.BertForSequenceClassification),
            "roberta": (transformers.RobertaConfig, transformers.RobertaForSequenceClassification),
            "mpnet": (transformers.MPNetConfig, transformers.MPNetForSequenceClassification),
        }[kind]
        config = config_cls(
            hidden_size=24,
            num_hidden_layers=depth,
            num_attention_heads=num_heads,
            intermediate_size=48,
            **common,
        )
        model = model_cls(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name:
                continue
            if p.ndim >= 2 or "bias" in name:
                p.mul_(scale)
    return model.eval()


def text_batch(
    seed: int = 0, batch: int = 6, tokens: int = 12
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (B, T) and a ragged attention mask: sample i has a different number of real
    tokens (the rest is padding with id 1), the first token is 0 (a class token)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 60, (batch, tokens), generator=g)
    lengths = torch.randint(3, tokens + 1, (batch,), generator=g)
    lengths[0] = tokens
    mask = (torch.arange(tokens)[None] < lengths[:, None]).long()
    ids[:, 0] = 0
    ids[mask == 0] = 1
    return ids, mask


# --- tiny random OpenCLIP models (no weights exist offline: docs/clip.md) -------------

CLIP_CLASSES = ("cat", "dog", "car", "ship", "plane")


def make_tiny_clip(
    *,
    layer_scale: bool = False,
    pool: str = "tok",
    final_ln_after_pool: bool = False,
    quick_gelu: bool = False,
    layers: int = 3,
    width: int = 64,
    heads: int = 4,
    image_size: int = 32,
    patch_size: int = 8,
    embed_dim: int = 32,
    text_layers: int = 1,
    text_heads: int = 2,
    seed: int = 0,
):
    """A randomly initialised open_clip ``CLIP`` (image tower ``layers`` x ``heads``, 17 tokens at
    the defaults; a text tower of ``text_layers`` x ``text_heads`` with open_clip's own tokenizer
    vocabulary), in eval mode, with every parameter perturbed so that norms, layer scales and
    biases are not trivial."""
    from open_clip.model import CLIP

    torch.manual_seed(seed)
    cfg = tiny_clip_config(
        layer_scale=layer_scale,
        pool=pool,
        final_ln_after_pool=final_ln_after_pool,
        quick_gelu=quick_gelu,
        layers=layers,
        width=width,
        heads=heads,
        image_size=image_size,
        patch_size=patch_size,
        embed_dim=embed_dim,
        text_layers=text_layers,
        text_heads=text_heads,
    )
    model = CLIP(**cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("visual.") and "class_embedding" not in name:
                p.add_(0.05 * torch.randn_like(p))
        # the text tower's after the image tower's, from a generator of its own: the image
        # tower is the one it always was
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if name.startswith(("transformer.", "ln_final.")):
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


def make_tiny_zero_shot(classes=CLIP_CLASSES, towers="image", templates=None, **kwargs):
    """A :class:`~hydra_core.models.zero_shot.ZeroShotClassifier` on :func:`make_tiny_clip`,
    with the class embeddings of open_clip's tokenizer and the default prompt (or
    ``templates``); ``towers`` "image" (the image tower's heads) or "both" (the joint layout)."""
    import open_clip

    from hydra_core.models.zero_shot import DEFAULT_TEMPLATE, zero_shot_classifier

    clip = make_tiny_clip(**kwargs)
    tokenizer = open_clip.SimpleTokenizer(context_length=16)
    templates = templates or (DEFAULT_TEMPLATE,)
    return zero_shot_classifier(clip, tokenizer, classes, templates, towers=towers)


def clip_images(n: int = 6, size: int = 32, seed: int = 0) -> torch.Tensor:
    """Preprocessed (float) images for the tiny CLIP models."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g)


#: preprocessing a saved tiny model declares (not open_clip's defaults, so that it is seen read)
PREPROCESS_CFG = {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]}


def tiny_clip_config(
    *,
    layer_scale: bool = False,
    pool: str = "tok",
    final_ln_after_pool: bool = False,
    quick_gelu: bool = False,
    layers: int = 3,
    width: int = 64,
    heads: int = 4,
    image_size: int = 32,
    patch_size: int = 8,
    embed_dim: int = 32,
    text_layers: int = 1,
    text_heads: int = 2,
    **_,
) -> dict:
    """The ``model_cfg`` of open_clip_config.json that builds :func:`make_tiny_clip` with these
    settings."""
    return {
        "embed_dim": embed_dim,
        "quick_gelu": quick_gelu,
        "vision_cfg": {
            "layers": layers,
            "width": width,
            "head_width": width // heads,
            "patch_size": patch_size,
            "image_size": image_size,
            "ls_init_value": 0.5 if layer_scale else None,
            "pool_type": pool,
            "final_ln_after_pool": final_ln_after_pool,
        },
        "text_cfg": {
            "context_length": 16,
            "vocab_size": 49408,
            "width": 16 * text_heads,
            "heads": text_heads,
            "layers": text_layers,
        },
    }


def save_tiny_clip(
    folder: Path,
    *,
    weights: str = "open_clip_model.safetensors",
    random_weights: bool = True,
    preprocess_cfg: dict | None = None,
    **kwargs,
) -> Path:
    """:func:`make_tiny_clip` (``kwargs``) saved as an open_clip folder: open_clip_config.json
    (``model_cfg``, ``preprocess_cfg``, and ``random_weights``: these weights are random) and
    the weights as ``weights`` (safetensors, or a torch state dict for .bin/.pth), the names
    open_clip's ``_find_checkpoint_in_dir`` looks for. Returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "model_cfg": tiny_clip_config(**kwargs),
        "preprocess_cfg": PREPROCESS_CFG if preprocess_cfg is None else preprocess_cfg,
    }
    if random_weights:
        config["random_weights"] = True
    (folder / "open_clip_config.json").write_text(json.dumps(config, indent=2))
    state = make_tiny_clip(**kwargs).state_dict()
    if weights.endswith(".safetensors"):
        save_file(state, str(folder / weights))
    else:
        torch.save(state, folder / weights)
    return folder


# --- shared by the text-model tests ---------------------------------------------------------------


def block_network(patch: pytest.MonkeyPatch) -> list:
    """Make every connection fail, and return the list of the attempts (libraries catch the
    error and fall back, so the attempts are what a test checks)."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network blocked by the test")

    patch.setattr(socket.socket, "connect", refuse)
    patch.setattr(socket, "getaddrinfo", refuse)
    return attempts


WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film", "a", "very", "is"]


def save_tiny_folder(folder, classes=("neg", "pos", "mixed")):
    """A tiny random BERT classifier and its tokenizer (:data:`WORDS`) saved as a Hugging Face
    folder (``save_pretrained``); returns both."""
    import transformers

    model = make_tiny_text("bert", num_labels=len(classes))
    model.config.id2label = dict(enumerate(classes))
    model.config.label2id = {c: i for i, c in enumerate(classes)}
    tokenizer = transformers.BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)})
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


# --- the families the contract suites run on (tests/families.py) --------------------------------

#: open_clip tower configurations (make_tiny_clip keywords): layer scale, pooling, where ln_post
#: is applied, the activation
CLIP_VARIANTS = {
    "plain": dict(),
    "layer-scale": dict(layer_scale=True),
    "avg-pool": dict(pool="avg"),
    "ln-after-pool": dict(final_ln_after_pool=True),
    "quick-gelu": dict(quick_gelu=True),
    "avg-ln-after-pool-scaled": dict(pool="avg", final_ln_after_pool=True, layer_scale=True),
}

#: every tiny model a contract suite checks: each timm configuration, each text kind, each
#: OpenCLIP tower configuration (``<family>-<configuration>``)
FAMILY_IDS = (
    *(f"vit-{c}" for c in sorted(TINY_CONFIGS)),
    *(f"text-{k}" for k in TEXT_KINDS),
    *(f"openclip-{v}" for v in CLIP_VARIANTS),
)


@pytest.fixture(params=FAMILY_IDS)
def family(request):
    """A :class:`tests.families.Family`: the contract suites' view of one tiny model."""
    from tests.families import family_for

    return family_for(request.param)
