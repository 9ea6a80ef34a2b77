"""The paper's efficient ensembles (hydra_core.baselines: packed, mimo, batch_ensemble, lora,
efficient): each TorchUncertainty- or peft-built piece against its plain definition, the
ensemble's probabilities against the members', and the stored copies (cache, resume) bit for
bit."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_uncertainty.layers import PackedLinear

from hydra_core.baselines import efficient
from hydra_core.baselines.batch_ensemble import TokenBatchLinear, batch_ensemble, member_weight
from hydra_core.baselines.lora import LoRAEnsemble, adapter_state, attention_linears, lora_member
from hydra_core.baselines.mimo import MIMOViT, mimo_batch
from hydra_core.baselines.packed import PackedViT, member_vit, packed_shape
from hydra_core.data.images import ImageSet
from hydra_core.evaluate import evaluate_system, probabilities
from hydra_core.hydra.finetune import FinetuneConfig
from hydra_core.zoo.default import TrainConfig, VitConfig, build_vit, preprocess, save_checkpoint
from tests.conftest import make_tiny_vit

#: head size 4, so that E = 3, alpha = 2 give members of width 16 with 4 heads
ARCH = VitConfig(embed_dim=24, depth=2, num_heads=6, mlp_ratio=2.0)


def _images(n: int, seed: int) -> ImageSet:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
    return ImageSet("tiny", images, torch.randint(0, 10, (n,), generator=g))


def _x(n: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


# --- Packed-Ensembles ---------------------------------------------------------------------------


def test_packed_linear_is_a_block_diagonal_linear_computed_by_hand():
    torch.manual_seed(0)
    layer = PackedLinear(8, 6, alpha=2, num_estimators=2)  # 16 -> 12 channels, 2 groups
    x = torch.randn(5, 3, 16)
    w = layer.weight.detach()  # (groups, 6, 8)
    by_hand = torch.zeros(5, 3, 12)
    for g in range(2):
        by_hand[..., g * 6 : (g + 1) * 6] = x[..., g * 8 : (g + 1) * 8] @ w[g].T
    by_hand += layer.bias.detach()
    torch.testing.assert_close(layer(x), by_hand)
    torch.testing.assert_close(layer(x), F.linear(x, torch.block_diag(*w), layer.bias))


def test_packed_head_returns_each_members_logits():
    torch.manual_seed(0)
    head = PackedLinear(8, 5, alpha=2, num_estimators=2, last=True)  # 16 -> 2 x 5 logits
    x = torch.randn(3, 16)
    w, b = head.weight.detach(), head.bias.detach()
    out = head(x)  # (E * B, 5), member-major
    for m in range(2):
        plain = x[:, m * 8 : (m + 1) * 8] @ w[m].T + b[m * 5 : (m + 1) * 5]
        torch.testing.assert_close(out[m * 3 : (m + 1) * 3], plain)


def test_packed_vit_is_independent_vits():
    torch.manual_seed(0)
    packed = PackedViT(ARCH, estimators=3, alpha=2.0).eval()
    assert packed.shape.width == 16 and packed.shape.heads == 4 and packed.shape.hidden == 32
    with torch.no_grad():
        for p in packed.parameters():  # timm's init is nearly inert: make every member matter
            p.add_(0.3 * torch.randn_like(p))
        x = _x()
        out = packed(x)
        assert out.shape == (5, 3, 10)
        for m in range(3):
            torch.testing.assert_close(member_vit(packed, m)(x), out[:, m], atol=1e-5, rtol=1e-5)
        # a member's weights change its own logits only
        packed.blocks[0].fc1.weight[1].add_(1.0)
        again = packed(x)
    torch.testing.assert_close(again[:, [0, 2]], out[:, [0, 2]])
    assert not torch.allclose(again[:, 1], out[:, 1])


def test_packed_shape_refuses_fractional_members():
    with pytest.raises(ValueError, match="multiple of the head size"):
        packed_shape(VitConfig(embed_dim=24, num_heads=4), 3, 2.0)  # width 16, heads of 6
    assert packed_shape(VitConfig(), 3, 2.0).heads == 8  # the default ViT: 8 heads of 16


# --- MIMO -----------------------------------------------------------------------------------------


def test_mimo_splits_inputs_by_channel_and_logits_by_class():
    torch.manual_seed(0)
    mimo = MIMOViT(ARCH, estimators=3).eval()
    xs = [_x(4, seed) for seed in range(3)]
    with torch.no_grad():
        grouped = mimo.grouped(torch.cat(xs))  # member-major: (3 * 4, 10)
        wide = mimo.vit(torch.cat(xs, dim=1))  # the plain definition: channels stacked
        for m in range(3):
            torch.testing.assert_close(grouped[m * 4 : (m + 1) * 4], wide[:, m * 10 : (m + 1) * 10])
        same = mimo(xs[0])  # test time: every member sees the same image
        plain = mimo.vit(xs[0].repeat(1, 3, 1, 1))
    for m in range(3):
        torch.testing.assert_close(same[:, m], plain[:, m * 10 : (m + 1) * 10])


def test_mimo_batch_shares_rho_of_the_rows_and_keeps_labels():
    x = torch.arange(8.0).view(8, 1, 1, 1).expand(8, 1, 2, 2).contiguous()
    labels = torch.arange(8)
    inputs, targets = mimo_batch(x, labels, 3, 0.5, 4, seed=7)
    assert inputs.shape == (3 * 32, 1, 2, 2) and targets.shape == (96,)
    torch.testing.assert_close(inputs[:, 0, 0, 0].long(), targets)  # each image keeps its label
    rows = targets.view(3, 32)
    torch.testing.assert_close(rows[0, 16:], rows[1, 16:])  # the last rho share: the same rows
    torch.testing.assert_close(rows[0, 16:], rows[2, 16:])
    assert all(sorted(r.tolist()) == sorted(list(range(8)) * 4) for r in rows)  # batch repeated 4x
    again, _ = mimo_batch(x, labels, 3, 0.5, 4, seed=7)
    torch.testing.assert_close(again, inputs)  # seeded: the same batch whatever ran before


# --- BatchEnsemble -----------------------------------------------------------------------------


def test_batch_ensemble_members_are_rank_one_scaled_copies():
    model = make_tiny_vit(seed=1)
    be = batch_ensemble(model, estimators=3, seed=0)
    x = torch.randn(4, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    layers = dict(be.core.named_modules())
    with torch.no_grad():
        out = be(x)  # (4, 3, classes)
        for m in range(3):
            plain = copy.deepcopy(model)
            for name, module in plain.named_modules():
                if isinstance(module, nn.Linear):
                    source = layers[name]
                    assert isinstance(source, TokenBatchLinear)
                    by_hand = source.linear.weight * (
                        source.s_group[m][:, None] * source.r_group[m]
                    )
                    torch.testing.assert_close(member_weight(source, m), by_hand)
                    module.weight.copy_(by_hand)
                    module.bias.copy_(source.bias[m])
            torch.testing.assert_close(out[:, m], plain(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_token_batch_linear_gives_torch_uncertaintys_numbers_bit_for_bit(bias):
    """The broadcast forward (r, s and bias not repeated row by row) equals TorchUncertainty's
    ``BatchLinear.forward`` exactly, on token inputs (flattened as the library needs them) and
    on plain rows; a plain batch that is no multiple of E takes the library's own rule."""
    from torch_uncertainty.layers import BatchLinear

    torch.manual_seed(0)
    layer = TokenBatchLinear(12, 20, 3, bias=bias)
    with torch.no_grad():
        layer.r_group.normal_(1, 0.5)
        layer.s_group.normal_(1, 0.5)
        if bias:
            layer.bias.normal_()
        tokens = torch.randn(6, 5, 12)
        expected = BatchLinear.forward(layer, tokens.reshape(-1, 12)).reshape(6, 5, 20)
        assert torch.equal(layer(tokens), expected)
        rows = torch.randn(9, 12)
        assert torch.equal(layer(rows), BatchLinear.forward(layer, rows))
        ragged = torch.randn(7, 12)  # 7 = 2 x 3 + 1: the library repeats the first rows' weights
        assert torch.equal(layer(ragged), BatchLinear.forward(layer, ragged))


def test_batch_ensemble_starts_from_the_trained_weights():
    model = make_tiny_vit(seed=1)
    x = torch.randn(4, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    be = batch_ensemble(model, estimators=2, init_std=0.0)  # r = s = 1: every member is the model
    with torch.no_grad():
        out, plain = be(x), model(x)
    for m in range(2):
        torch.testing.assert_close(out[:, m], plain, atol=1e-5, rtol=1e-5)
    trained = batch_ensemble(model, estimators=2).train()
    assert trained(x[:4]).shape == (4, 5)  # training: the batch split among the members
    with pytest.raises(ValueError, match="multiple of its 2 members"):
        trained(x[:3])


# --- LoRA Ensembles ---------------------------------------------------------------------------


def _trained_adapters(member, seed: int) -> None:
    """Stand-in for fine-tuning: B (zero at the start) set to random values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in member.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g))


def test_lora_targets_attention_and_merges_to_w_plus_ba_times_alpha_over_r():
    model = make_tiny_vit(seed=3)
    names = attention_linears(model)
    assert names and all(n.endswith(("attn.qkv", "attn.proj")) for n in names)
    member = lora_member(model, seed=5)
    trainable = [n for n, p in member.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    x = torch.randn(4, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(member(x), model(x))  # B = 0: the member starts as the model
        _trained_adapters(member, 1)
        unmerged = member(x)
        qkv = member.base_model.model.blocks[0].attn.qkv
        a, b = qkv.lora_A["default"].weight, qkv.lora_B["default"].weight
        by_hand = model.blocks[0].attn.qkv.weight + b @ a * (8 / 4)
        merged = copy.deepcopy(member).merge_and_unload()
        torch.testing.assert_close(merged.blocks[0].attn.qkv.weight, by_hand)
        torch.testing.assert_close(merged(x), unmerged, atol=1e-5, rtol=1e-5)


def test_lora_ensemble_runs_each_member_alone():
    model = make_tiny_vit(seed=3)
    members = [lora_member(model, seed=s) for s in (0, 1)]
    for s, member in enumerate(members):
        _trained_adapters(member, 10 + s)
    ensemble = LoRAEnsemble(model, [adapter_state(m) for m in members])
    x = torch.randn(4, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = ensemble(x)
        for s, member in enumerate(members):
            torch.testing.assert_close(out[:, s], member(x), atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in ensemble.parameters()) < 1.5 * sum(
        p.numel() for p in model.parameters()
    )  # one copy of the model and the adapters


# --- the ensemble's probabilities ------------------------------------------------------------


def test_ensemble_probabilities_are_the_mean_of_the_members():
    torch.manual_seed(0)
    packed = PackedViT(ARCH).eval()
    with torch.no_grad():
        for p in packed.parameters():
            p.add_(0.3 * torch.randn_like(p))
    id_set, ood = _images(12, 1), replace(_images(8, 2), name="ood", labels=None, group="far")
    ev = evaluate_system(packed, preprocess, id_set, [ood], name="packed")
    with torch.no_grad():
        members = packed(preprocess(id_set.images))
    torch.testing.assert_close(ev.id.logits, members)
    mean = members.softmax(-1).mean(1)
    torch.testing.assert_close(probabilities(ev.id.logits), mean)
    accuracy = (mean.argmax(-1) == id_set.labels).float().mean().item()
    assert ev.id_metrics()["accuracy"] == pytest.approx(accuracy)


# --- stored copies: cache and resume ---------------------------------------------------------


@pytest.fixture
def reference(tmp_path) -> str:
    torch.manual_seed(0)
    path = tmp_path / "ref.safetensors"
    recipe = TrainConfig(epochs=3, batch_size=16, warmup_epochs=0.5)
    save_checkpoint(build_vit(ARCH), path, ARCH, train_config=vars(recipe))
    return str(path)


class Stop(Exception):
    pass


def _stop_at(step: int):
    def progress(done: int, total: int) -> None:
        if done == step:
            raise Stop

    return progress


@pytest.mark.parametrize("method", efficient.FROM_SCRATCH)
def test_scratch_copy_is_cached_and_resumes_bit_for_bit(method, reference, tmp_path):
    train, val = _images(40, 1), _images(16, 2)  # 3 steps per epoch, 3 epochs
    kwargs = dict(reference=reference, train_set=train, validation_set=val, log=lambda s: None)
    whole = efficient.scratch_copy(method, root=tmp_path / "a", **kwargs)
    root = tmp_path / "b"
    with pytest.raises(Stop):  # stopped in the second epoch: the first is kept
        efficient.scratch_copy(method, root=root, progress=_stop_at(5), **kwargs)
    assert [p.name.endswith(".resume.pt") for p in root.iterdir()] == [True]
    resumed = efficient.scratch_copy(method, root=root, **kwargs)
    for (name, a), (_, b) in zip(
        whole.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert [p.suffix for p in root.iterdir()] == [".safetensors"]  # the resume file is gone
    loaded = efficient.scratch_copy(method, root=root, train=False, **kwargs)
    assert all(
        torch.equal(a, b) for a, b in zip(loaded.parameters(), whole.parameters(), strict=True)
    )
    stored = efficient.read_meta(efficient.stored_paths(method, root)[0])
    assert stored["method"] == method and len(stored["summary"]["history"]) == 3
    other = efficient.scratch_copy(method, root=root, train=False, epochs=2, **kwargs)
    assert other is None  # another recipe is another copy


FINETUNE = FinetuneConfig(optimizer="adamw", lr=1e-3, epochs=2, batch_size=6, n_train=None)


def test_batch_ensemble_copy_is_cached_and_resumes_bit_for_bit(tmp_path):
    model = make_tiny_vit(seed=1)
    data = ImageSet("tiny", _images(16, 1).images[..., :16, :16], _images(16, 1).labels % 5)
    kwargs = dict(config=FINETUNE, train_set=data)
    prep = lambda images: images.float() / 255  # noqa: E731
    whole = efficient.batch_ensemble_copy(model, prep, root=tmp_path / "a", **kwargs)
    root = tmp_path / "b"
    with pytest.raises(Stop):
        efficient.batch_ensemble_copy(model, prep, root=root, progress=_stop_at(4), **kwargs)
    resumed = efficient.batch_ensemble_copy(model, prep, root=root, **kwargs)
    assert all(
        torch.equal(a, b) for a, b in zip(whole.parameters(), resumed.parameters(), strict=True)
    )
    start = batch_ensemble(model)
    assert not torch.equal(whole.core.head.r_group, start.core.head.r_group)  # it trained
    assert torch.equal(whole.core.patch_embed.proj.weight, model.patch_embed.proj.weight)
    loaded = efficient.batch_ensemble_copy(model, prep, root=root, train=False, **kwargs)
    assert all(
        torch.equal(a, b) for a, b in zip(whole.parameters(), loaded.parameters(), strict=True)
    )
    other = efficient.batch_ensemble_copy(
        make_tiny_vit(seed=2), prep, root=root, train=False, **kwargs
    )
    assert other is None  # another source model is another copy


def test_lora_copy_is_stored_member_by_member(tmp_path):
    model = make_tiny_vit(seed=1)
    data = ImageSet("tiny", _images(12, 1).images[..., :16, :16], _images(12, 1).labels % 5)
    settings = efficient.EfficientSettings(seeds=(0, 1))
    prep = lambda images: images.float() / 255  # noqa: E731
    kwargs = dict(config=FINETUNE, train_set=data, settings=settings)

    def stop_in_second(seed: int, done: int, total: int) -> None:
        if seed == 1 and done == 1:
            raise Stop

    with pytest.raises(Stop):
        efficient.lora_copy(model, prep, root=tmp_path, progress=stop_in_second, **kwargs)
    assert len(efficient.stored_paths(efficient.LORA, tmp_path)) == 1  # the finished member
    assert efficient.lora_copy(model, prep, root=tmp_path, train=False, **kwargs) is None
    ensemble = efficient.lora_copy(model, prep, root=tmp_path, **kwargs)
    alone = efficient.lora_copy(model, prep, root=tmp_path / "c", **kwargs)
    x = torch.randn(3, 1, 16, 16, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(ensemble(x), alone(x), rtol=0, atol=0)
        assert not torch.allclose(ensemble(x)[:, 0], model(x))  # the adapters trained


# --- a text model (the text default's family: BERT encoders) ---------------------------------


def test_text_model_batch_ensemble_and_lora_members_take_packed_token_ids():
    from hydra_core.evaluate import callable_model
    from hydra_core.models.text import pack
    from tests.conftest import make_tiny_text, text_batch

    model = make_tiny_text("bert")
    x = pack(*text_batch())
    with torch.no_grad():
        plain = callable_model(model)(x)
        be = batch_ensemble(
            model, estimators=3, init_std=0.0
        )  # r = s = 1: each member is the model
        out = be(x)
        for m in range(3):
            torch.testing.assert_close(out[:, m], plain, atol=1e-5, rtol=1e-5)
        drawn = batch_ensemble(model, estimators=3)(x)
        assert not torch.allclose(drawn[:, 0], drawn[:, 1])
    names = attention_linears(model)
    assert len(names) == 8 and all(".attention." in n for n in names)  # Q, K, V, output x 2
    members = [lora_member(model, seed=s) for s in (0, 1)]
    for s, member in enumerate(members):
        _trained_adapters(member, 20 + s)
    ensemble = LoRAEnsemble(model, [adapter_state(m) for m in members])
    with torch.no_grad():
        out = ensemble(x)
        for s, member in enumerate(members):
            alone = callable_model(member.base_model.model)(x)
            torch.testing.assert_close(out[:, s], alone, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out[:, 0], plain)


def test_batch_ensemble_on_the_top_blocks_leaves_the_blocks_below_as_they_are():
    """``top_blocks=1`` on a 2-layer text encoder: the top layer's and the head's linear layers
    are BatchEnsemble layers whose members are rank-1 scaled copies (checked against the model
    with each member's weights put in by hand); the lower layer stays the model's, frozen."""
    from hydra_core.evaluate import callable_model
    from hydra_core.models.text import pack
    from tests.conftest import make_tiny_text, text_batch

    model = make_tiny_text("bert", depth=2)
    x = pack(*text_batch())
    be = batch_ensemble(model, estimators=3, seed=0, top_blocks=1)
    layers = dict(be.core.named_modules())
    converted = {n for n, m in layers.items() if isinstance(m, TokenBatchLinear)}
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    below = {n for n in linears if ".layer.0." in n}
    assert below and converted == {f"hf.{n}" for n in linears - below}
    assert all(not p.requires_grad for n, p in be.named_parameters() if ".layer.0." in n)
    assert all(p.requires_grad for n, p in be.named_parameters() if ".layer.1." in n)
    with torch.no_grad():
        out = be(x)
        for m in range(3):
            plain = copy.deepcopy(model)
            for name in linears - below:
                source, module = layers[f"hf.{name}"], plain.get_submodule(name)
                module.weight.copy_(member_weight(source, m))
                module.bias.copy_(source.bias[m])
            torch.testing.assert_close(out[:, m], callable_model(plain)(x), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="top_blocks must be 1..2"):
        batch_ensemble(model, top_blocks=3)


def test_a_text_models_batch_ensemble_takes_its_modalitys_top_blocks(tmp_path):
    """The text modality declares the top two blocks; the image ViT every layer. A text copy
    trains only what the draw converted and records it; the frozen layers stay the model's."""
    from hydra_core.data.text import TextSet
    from hydra_core.models.text import pack
    from tests.conftest import make_tiny_text

    assert efficient.batch_blocks(make_tiny_vit(seed=1)) is None
    model = make_tiny_text("bert", depth=3)
    assert efficient.batch_blocks(model) == 2
    g = torch.Generator().manual_seed(0)
    words = torch.randint(3, 50, (12, 5), generator=g).tolist()
    texts = tuple(" ".join(map(str, row)) for row in words)
    data = TextSet("tiny", texts, torch.arange(12) % 3)

    def prep(items):
        ids = torch.tensor([[0, *(int(w) for w in t.split())] for t in items])
        return pack(ids, torch.ones_like(ids))

    copy_ = efficient.batch_ensemble_copy(
        model, prep, config=FINETUNE, train_set=data, root=tmp_path
    )
    lower = model.bert.encoder.layer[0]
    trained = copy_.core.hf.bert.encoder.layer[0]
    pairs = zip(lower.parameters(), trained.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    start = batch_ensemble(model, top_blocks=2)
    assert not torch.equal(copy_.core.hf.classifier.r_group, start.core.hf.classifier.r_group)
    (path,) = efficient.stored_paths(efficient.BATCH, tmp_path)
    assert efficient.read_meta(path)["settings"]["top_blocks"] == 2


def test_stored_copy_names_the_files_without_training(tmp_path):
    model = make_tiny_vit(seed=1)
    data = ImageSet("tiny", _images(12, 1).images[..., :16, :16], _images(12, 1).labels % 5)
    prep = lambda images: images.float() / 255  # noqa: E731
    settings = efficient.EfficientSettings(seeds=(0,))
    args = dict(settings=settings, train_set=data, root=tmp_path)
    assert efficient.stored_copy(efficient.LORA, model, prep, **args) is None
    assert efficient.stored_copy(efficient.PACKED, model, prep, **args) is None  # no reference
    config = replace(efficient.LORA_FINETUNE, n_train=None, batch_size=6, epochs=1)
    efficient.lora_copy(model, prep, config=config, **args)
    assert efficient.stored_copy(efficient.LORA, model, prep, **args) is None  # another recipe
    efficient.lora_copy(model, prep, **args)
    (path,) = efficient.stored_copy(efficient.LORA, model, prep, **args)
    assert path.name.startswith("lora-ensembles-seed0-") and path.is_file()
