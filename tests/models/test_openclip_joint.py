"""CLIP pruned in both towers (the paper's D.3) on tiny random open_clip models: the joint head
layout (image-tower layers, then text-tower layers), every transform against an independent
computation with open_clip's own ``encode_image`` / ``encode_text`` on a copy whose removed heads'
W_O columns are zeroed (float64, 1e-9): ablation, structural pruning, fusion, the fast greedy
search, Taylor scores; and what the joint layout changes elsewhere (head features, mask files,
cost)."""

from __future__ import annotations

import copy
import functools

import open_clip
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hydra_core as hc
from hydra_core.analysis import _suffix
from hydra_core.analysis._towers import TowersEvaluator
from hydra_core.analysis.greedy import greedy_circuit, single_head_importance
from hydra_core.analysis.representations import head_cls_features
from hydra_core.analysis.taylor import taylor_scores
from hydra_core.errors import InputError
from hydra_core.hydra.cost import count_macs, count_params, parameter_breakdown
from hydra_core.hydra.fused import fuse_members, load_hydra, save_hydra
from hydra_core.hydra.fused_clip import HydraZeroShot
from hydra_core.masks import MaskFileError, MemberMask, masks_from_json, masks_to_json
from hydra_core.models.adapter import UnsupportedModelError, family_of, record_head_outputs
from hydra_core.models.openclip import OPENCLIP
from hydra_core.models.openclip_blocks import PrunedMultiheadAttention
from hydra_core.models.openclip_text import OPENCLIP_TEXT, ClipTextTower
from hydra_core.models.zero_shot import zero_shot_classifier
from tests.analysis.test_greedy import assert_same_search
from tests.conftest import CLIP_CLASSES, clip_images, make_tiny_clip, random_mask

IMAGE_LAYERS, IMAGE_HEADS, TEXT_LAYERS, TEXT_HEADS, DK = 3, 4, 2, 2, 16
LAYERS = IMAGE_LAYERS + TEXT_LAYERS
TOL = 1e-9  # float64
TEMPLATES = ("A photo of a {label}.", "a sketch of the {label}")
TOKENIZER = open_clip.SimpleTokenizer(context_length=16)
#: image tower configurations, as in test_openclip_family
VARIANTS = {
    "tok": dict(),
    "layerscale-avg": dict(layer_scale=True, pool="avg"),
    "ln-after-pool-quickgelu": dict(final_ln_after_pool=True, quick_gelu=True),
}


@functools.cache
def _built(variant: str, templates: tuple[str, ...]) -> tuple[nn.Module, nn.Module]:
    clip = make_tiny_clip(text_layers=TEXT_LAYERS, text_heads=TEXT_HEADS, **VARIANTS[variant])
    clip = clip.double()
    model = zero_shot_classifier(clip, TOKENIZER, CLIP_CLASSES, templates, towers="both")
    return clip, model


def joint(variant: str = "tok", templates=TEMPLATES[:1]) -> tuple[nn.Module, nn.Module]:
    """(the open_clip CLIP model, the joint zero-shot classifier sharing its modules), float64,
    fresh copies."""
    return copy.deepcopy(_built(variant, tuple(templates)))


def reference_logits(
    clip: nn.Module,
    keep: torch.Tensor,
    images: torch.Tensor,
    scale: torch.Tensor,
    templates=TEMPLATES[:1],
) -> torch.Tensor:
    """Logits of ``clip`` with the removed heads' W_O columns zeroed in both towers, through
    open_clip's own encode_image, encode_text and build_zero_shot_classifier."""
    ref = copy.deepcopy(clip)
    blocks = [*ref.visual.transformer.resblocks, *ref.transformer.resblocks]
    with torch.no_grad():
        for layer, block in enumerate(blocks):
            removed = ~keep[layer, : block.attn.num_heads]
            block.attn.out_proj.weight[:, removed.repeat_interleave(DK)] = 0
        weights = open_clip.build_zero_shot_classifier(
            ref, TOKENIZER, CLIP_CLASSES, [t.replace("{label}", "{}") for t in templates]
        )  # (D, C)
        image = F.normalize(ref.encode_image(images), dim=-1)
        return scale.double() * image @ weights


def mixed_masks() -> list[torch.Tensor]:
    """Masks of the joint layout: text heads only, mixed, a text layer with no head, an image
    layer with no head."""
    masks = []
    for seed in range(4):
        keep = random_mask((LAYERS, IMAGE_HEADS), seed)
        keep[IMAGE_LAYERS:, TEXT_HEADS:] = False
        masks.append(keep)
    masks[0][:IMAGE_LAYERS] = True
    masks[0][IMAGE_LAYERS] = torch.tensor([False, True, False, False])
    masks[1][IMAGE_LAYERS + 1, :TEXT_HEADS] = False
    masks[2][1] = False
    masks[3][IMAGE_LAYERS:, :TEXT_HEADS] = True
    masks[3][IMAGE_LAYERS, 0] = False
    return masks


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_joint_layout_names_its_towers():
    clip, model = joint()
    layout = hc.head_layout(model)
    assert layout.num_heads == (4, 4, 4, 2, 2) and layout.shape == (LAYERS, IMAGE_HEADS)
    assert layout.towers == (("image", 3), ("text", 2)) and layout.head_dim == DK
    assert layout.layer_names() == ["image L0", "image L1", "image L2", "text L0", "text L1"]
    assert layout.tower_of(4) == ("text", 1)
    assert family_of(model) is OPENCLIP and family_of(model.text) is OPENCLIP_TEXT
    assert model.towers == "both" and model.text.blocks is clip.transformer.resblocks  # shared
    image_only = zero_shot_classifier(clip, TOKENIZER, CLIP_CLASSES, towers="image")
    assert hc.head_layout(image_only).towers == (("image", 3),)
    assert hc.head_layout(image_only).num_heads == (4, 4, 4)
    assert image_only.state_dict().keys() == {
        k for k in model.state_dict() if not k.startswith("text.")
    }  # the image-only classifier is what it always was
    with torch.no_grad():  # both start from the same class embeddings
        images = clip_images(3).double()
        assert torch.equal(model(images), image_only(images))


@pytest.mark.parametrize("templates", [TEMPLATES[:1], TEMPLATES], ids=["one", "ensemble"])
def test_text_tower_equals_encode_text_and_the_class_embeddings(templates):
    clip, model = joint(templates=templates)
    text = model.text
    prompts = text.prompts
    assert prompts.shape == (len(CLIP_CLASSES) * len(templates), 16)
    with torch.no_grad():
        torch.testing.assert_close(text(prompts), clip.encode_text(prompts), rtol=0, atol=TOL)
        weights = open_clip.build_zero_shot_classifier(
            clip, TOKENIZER, CLIP_CLASSES, [t.replace("{label}", "{}") for t in templates]
        )
        torch.testing.assert_close(text.class_embeddings(), weights.T, rtol=0, atol=TOL)
        torch.testing.assert_close(model.class_embeddings, weights.T, rtol=0, atol=TOL)
    # a causal mask: the forward runs up to the last end-of-text token, not the context length
    assert text.used_length(prompts) == int(prompts.argmax(-1).max()) + 1 < 16


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_ablate_and_prune_equal_zeroing_wo_columns_in_both_towers(variant):
    clip, model = joint(variant)
    images = clip_images(5, seed=1).double()
    state = snapshot(model)
    with torch.no_grad():
        dense = model(images)
        for keep in mixed_masks():
            expected = reference_logits(clip, keep, images, model.logit_scale)
            with hc.ablate(model, keep):
                ablated = model(images)
            torch.testing.assert_close(ablated, expected, rtol=0, atol=TOL)
            pruned = hc.prune_heads(model, keep)
            torch.testing.assert_close(pruned(images), expected, rtol=0, atol=TOL)
            assert hc.head_layout(pruned).num_heads == tuple(keep.sum(1).tolist())
            assert not pruned.text.live()  # its own class embeddings, computed once and stored
            kept = keep[IMAGE_LAYERS:].sum(1).tolist()
            for layer, block in enumerate(pruned.text.blocks):
                assert block.attn.in_proj_weight.shape == (3 * kept[layer] * DK, 32)
                if kept[layer] < TEXT_HEADS:
                    assert isinstance(block.attn, PrunedMultiheadAttention)
            assert (expected - dense).abs().max() > 1e-3  # the removed heads mattered
        with hc.ablate(model, hc.head_layout(model).all_kept()):
            assert torch.equal(model(images), dense)  # an all-True mask installs nothing
            assert model.text.interventions == 0
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert not any("forward" in vars(m) for m in model.modules())
    assert model.text.interventions == 0
    with torch.no_grad():
        assert torch.equal(model(images), dense)


def test_prompt_ensembles_and_nested_contexts():
    clip, model = joint(templates=TEMPLATES)
    images = clip_images(4, seed=2).double()
    outer, inner = mixed_masks()[0], mixed_masks()[3]
    with torch.no_grad(), record_head_outputs(model, [1, 3, 4], token=None) as store:
        with hc.ablate(model, outer):
            torch.testing.assert_close(
                model(images),
                reference_logits(clip, outer, images, model.logit_scale, TEMPLATES),
                rtol=0,
                atol=TOL,
            )
            with hc.ablate(model, inner):  # both contexts' hooks apply
                both = model(images)
        after = model(images)  # the recording context alone: nothing ablated
    torch.testing.assert_close(
        both,
        reference_logits(clip, outer & inner, images, model.logit_scale, TEMPLATES),
        rtol=0,
        atol=TOL,
    )
    torch.testing.assert_close(
        after,
        reference_logits(clip, outer | True, images, model.logit_scale, TEMPLATES),
        rtol=0,
        atol=TOL,
    )
    # the text heads recorded per prompt, an ablated one reads zero
    prompts = len(CLIP_CLASSES) * len(TEMPLATES)
    assert store[3][0].shape[:1] == (prompts,) and store[3][0][..., 0, :].abs().max() == 0
    assert store[1][0].shape[0] == 4  # an image layer: per image


def test_trained_weights_make_the_class_embeddings_again():
    _, model = joint()
    member = hc.prune_heads(model, mixed_masks()[1])
    with torch.no_grad():
        for p in member.text.parameters():
            p.mul_(1.1)  # as training would change them
        stale = member.class_embeddings.clone()
        OPENCLIP.weights_changed(member)  # what finetune_member calls after training
        assert not torch.allclose(member.class_embeddings, stale)
        assert torch.equal(member.class_embeddings, member.text.class_embeddings())


def test_pruned_text_tower_refreshes_on_dtype_change():
    clip, model = joint()
    keep = mixed_masks()[1]
    pruned = hc.prune_heads(model, keep).float()
    with torch.no_grad():
        assert pruned.class_embeddings.dtype == torch.float32
        torch.testing.assert_close(
            pruned.class_embeddings, pruned.text.class_embeddings(), rtol=0, atol=0
        )


def reference_taylor(clip: nn.Module, keep: torch.Tensor, x, y, scale) -> torch.Tensor:
    """|W * dL/dW| per head over the q, k and v rows of in_proj_weight, both towers, through
    open_clip's encode_image and encode_text on the zeroed copy."""
    ref = copy.deepcopy(clip)
    blocks = [*ref.visual.transformer.resblocks, *ref.transformer.resblocks]
    with torch.no_grad():
        for layer, block in enumerate(blocks):
            removed = ~keep[layer, : block.attn.num_heads]
            block.attn.out_proj.weight[:, removed.repeat_interleave(DK)] = 0
    tokens = TOKENIZER([f"A photo of a {c}." for c in CLIP_CLASSES])
    classes = F.normalize(ref.encode_text(tokens), dim=-1)
    logits = scale.double() * F.normalize(ref.encode_image(x), dim=-1) @ classes.T
    weights = [b.attn.in_proj_weight for b in blocks]
    grads = torch.autograd.grad(F.cross_entropy(logits, y), weights)
    scores = torch.full((LAYERS, IMAGE_HEADS), float("nan"), dtype=torch.float64)
    for layer, (w, g) in enumerate(zip(weights, grads, strict=True)):
        n = w.shape[0] // (3 * DK)
        scores[layer, :n] = (w * g).abs().reshape(3, n, DK, -1).mean(dim=(2, 3)).mean(0)
    scores[~keep] = float("nan")
    return scores.float()


def test_taylor_scores_cover_both_towers():
    clip, model = joint("layerscale-avg")
    x, y = clip_images(6, seed=7).double(), torch.arange(6) % 5
    for keep in (hc.head_layout(model).all_kept(), mixed_masks()[2]):
        scores = taylor_scores(model, x, y, keep=keep, batch_size=4)
        expected = reference_taylor(clip, keep, x, y, model.logit_scale)
        torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-9, equal_nan=True)
    assert torch.isfinite(
        scores[IMAGE_LAYERS:, :TEXT_HEADS][keep[IMAGE_LAYERS:, :TEXT_HEADS]]
    ).all()
    assert all(p.requires_grad for p in model.parameters())  # flags restored


def search_data(model: nn.Module, n: int = 20):
    id_x = clip_images(n, seed=5).double()
    with torch.no_grad():
        labels = model(id_x).argmax(-1)
    labels[::3] = torch.arange(len(labels[::3])) % 5
    return id_x, labels, 1.5 * clip_images(n, seed=6).double() + 0.5


@pytest.fixture
def small_passes(monkeypatch):
    monkeypatch.setattr(_suffix, "CPU_ROWS_PER_PASS", 5 * 17)
    monkeypatch.setattr(_suffix, "CPU_ROWS_PER_PASS_THREADED", 5 * 17)


@pytest.mark.parametrize(
    ("objective", "variant"), [("avg", "tok"), ("acc", "layerscale-avg"), ("ood", "tok")]
)
def test_fast_greedy_equals_plain_over_both_towers(objective, variant, small_passes):
    _, model = joint(variant, templates=TEMPLATES)
    id_x, id_y, ood_x = search_data(model)
    state = snapshot(model)
    total = hc.head_layout(model).total_heads
    # Up to the last three heads: with two or one left, the tiny random model's outputs are all
    # but constant, the items' MSPs differ by rounding alone, and the two paths round apart on
    # some CPUs (seen on AVX-512: one AUROC 0.5025 against 0.4625), a tie of noise, not a choice.
    budget = total - 3
    runs = [
        greedy_circuit(model, id_x, id_y, ood_x, objective=objective, budget=budget, method=m)
        for m in ("fast", "plain")
    ]
    assert_same_search(*runs, tol=TOL)
    first = runs[0].candidate_scores[0]
    assert not first[IMAGE_LAYERS:, :TEXT_HEADS].isnan().any()  # text heads are candidates
    assert len({float(v) for v in first[IMAGE_LAYERS:, :TEXT_HEADS].flatten()}) > 1
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_tower_candidates_equal_the_ablated_forward():
    clip, model = joint(templates=TEMPLATES)
    images = clip_images(7, seed=3).double()
    removed = [(0, 1), (2, 3), (3, 0), (1, 2)]
    keep = hc.head_layout(model).all_kept()
    for layer, head in removed:
        keep[layer, head] = False
    with torch.inference_mode():
        evaluator = TowersEvaluator(model, images, pairs_per_pass=2)
        evaluator.set_removed(removed)
        with hc.ablate(model, keep):
            torch.testing.assert_close(evaluator.logits, model(images), rtol=0, atol=TOL)
        seen = []
        for heads, logits in evaluator.candidate_logits():
            for (layer, head), got in zip(heads, logits, strict=True):
                one_less = keep.clone()
                one_less[layer, head] = False
                with hc.ablate(model, one_less):
                    torch.testing.assert_close(got, model(images), rtol=0, atol=TOL)
                seen.append((layer, head))
        assert seen == [tuple(h) for h in keep.nonzero().tolist()]
        units = evaluator.units()
        assert sorted(h for u in units for h in u.heads) == sorted(seen)
        some = {h for u in units[-2:] for h in u.heads}  # a share of the units, as a process
        assert {h for hs, _ in evaluator.candidate_logits(heads=some) for h in hs} == some
        after = evaluator.remove(4, 1)
        keep[4, 1] = False
        with hc.ablate(model, keep):
            torch.testing.assert_close(after, model(images), rtol=0, atol=TOL)


def test_single_head_importance_covers_text_heads():
    clip, model = joint()
    id_x, id_y, ood_x = search_data(model, n=12)
    result = single_head_importance(model, id_x, id_y, ood_x)
    for layer, head in [(0, 1), (3, 1), (4, 0)]:
        keep = hc.head_layout(model).all_kept()
        keep[layer, head] = False
        logits = reference_logits(clip, keep, id_x, model.logit_scale)
        accuracy = float((logits.argmax(-1) == id_y).double().mean())
        delta = accuracy - result["base_accuracy"]
        assert float(result["delta_accuracy"][layer, head]) == pytest.approx(delta, abs=1e-12)
    assert torch.isnan(result["delta_accuracy"][IMAGE_LAYERS:, TEXT_HEADS:]).all()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@torch.no_grad()
def test_fused_members_have_their_own_class_embeddings(variant, tmp_path):
    clip, model = joint(variant, templates=TEMPLATES)
    images = clip_images(6, seed=4).double()
    masks = mixed_masks()[:3]
    fused = fuse_members([(model, keep) for keep in masks])
    assert isinstance(fused, HydraZeroShot) and fused.class_embeddings.shape == (3, 5, 32)
    logits = fused(images)
    for m, keep in enumerate(masks):
        expected = reference_logits(clip, keep, images, model.logit_scale, TEMPLATES)
        torch.testing.assert_close(logits[:, m], expected, rtol=0, atol=TOL)
    assert fused.member_head_counts() == [k[:IMAGE_LAYERS].sum(1).tolist() for k in masks]
    # structurally pruned members (their text towers pruned, class embeddings stored) fuse alike
    pruned = [(hc.prune_heads(model, keep), None) for keep in masks]
    pruned = [(p, hc.head_layout(p).all_kept()) for p, _ in pruned]
    torch.testing.assert_close(fuse_members(pruned)(images), logits, rtol=0, atol=TOL)
    # ... and a pruned member ablated further in its text tower
    base = mixed_masks()[3]  # keeps both heads of text layer 1
    member = hc.prune_heads(model, base)
    further = hc.head_layout(member).all_kept()
    further[IMAGE_LAYERS + 1, 1] = False
    again = base.clone()
    again[IMAGE_LAYERS + 1, 1] = False
    torch.testing.assert_close(
        fuse_members([(member, further)])(images)[:, 0],
        reference_logits(clip, again, images, model.logit_scale, TEMPLATES),
        rtol=0,
        atol=TOL,
    )
    path = tmp_path / "joint.safetensors"
    save_hydra(fused.float(), path)
    loaded = load_hydra(path)
    assert torch.equal(loaded.class_embeddings, fused.float().class_embeddings)
    assert torch.equal(loaded(images.float()), fused.float()(images.float()))


def test_head_features_read_the_image_tower_only():
    _, model = joint()
    x = clip_images(6, seed=8).double()
    features = head_cls_features(model, x)
    assert features.shape == (6, IMAGE_LAYERS, IMAGE_HEADS, DK)
    torch.testing.assert_close(features, head_cls_features(model.visual, x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="layer 3 is in a tower whose heads do not see the"):
        head_cls_features(model, x, layers=[0, 3])


def test_mask_files_name_the_layout_and_old_image_only_files_stay_image_only():
    clip, model = joint()
    image_only = zero_shot_classifier(clip, TOKENIZER, CLIP_CLASSES, towers="image")
    layout, image_layout = hc.head_layout(model), hc.head_layout(image_only)
    keep = mixed_masks()[1]
    data = masks_to_json([MemberMask("m", "test", keep)], {"name": "clip", **_shape(layout)})
    data["model"]["towers"] = {"image": 3, "text": 2}
    assert torch.equal(masks_from_json(data, layout)[0].keep, keep)
    with pytest.raises(MaskFileError, match="image 3 \\+ text 2 layers .* towers 'both'"):
        masks_from_json(data, image_layout)
    old = masks_to_json([MemberMask("m", "test", keep[:IMAGE_LAYERS])], _identity(image_layout))
    del old["model"]["towers"]  # written before the towers were named
    assert torch.equal(masks_from_json(old, image_layout)[0].keep, keep[:IMAGE_LAYERS])
    with pytest.raises(MaskFileError, match="image 3 layers .*towers 'image' \\(--towers image"):
        masks_from_json(old, layout)


def _shape(layout) -> dict:
    return {"layers": layout.num_layers, "heads": layout.max_heads, "weights": "w"}


def _identity(layout) -> dict:
    from hydra_core.masks import model_identity

    identity = model_identity("clip", layout, "w")
    assert identity["towers"] == dict(layout.towers)
    return identity


def test_cost_counts_what_every_image_runs():
    _, model = joint()
    model = model.float()
    x = clip_images(2)
    image_only = copy.deepcopy(model)
    image_only.text = None
    assert count_params(model) == count_params(image_only)  # the text tower runs once
    assert sum(parameter_breakdown(model).values()) == count_params(model)
    keep = mixed_masks()[3]  # image heads removed, and text heads
    pruned = hc.prune_heads(model, keep)
    assert count_macs(pruned, x) == count_macs(hc.prune_heads(image_only, keep[:IMAGE_LAYERS]), x)


def test_refusals():
    clip = make_tiny_clip()
    with pytest.raises(InputError, match="towers must be one of both, image"):
        zero_shot_classifier(clip, TOKENIZER, CLIP_CLASSES, towers="text")
    model = zero_shot_classifier(clip, TOKENIZER, CLIP_CLASSES, towers="both")
    model.text.blocks[0].attn.head_dim = 8  # text heads of another width than the image's 16
    model.text.blocks[0].attn.num_heads = 4
    with pytest.raises(UnsupportedModelError, match="16 wide and the text tower's 8"):
        hc.head_layout(model)
    with pytest.raises(UnsupportedModelError, match="not open_clip's own TextTransformer"):
        ClipTextTower.of(_with_text(), TOKENIZER(["a"]), 1)


def _with_text() -> nn.Module:
    holder = nn.Module()
    holder.text = nn.Linear(2, 2)
    return holder


def test_cahp_is_refused_on_the_joint_layout():
    from hydra_core.analysis.inputs import SearchInputs
    from hydra_core.hydra.members import cahp_members

    _, model = joint()
    x = clip_images(6).double()
    inputs = SearchInputs(x, torch.arange(6) % 5, x, {"ood": x})
    with pytest.raises(InputError, match="text tower's see the prompts.*--towers image"):
        cahp_members(model, inputs, seeds=[0])
