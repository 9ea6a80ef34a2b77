"""ONNX export of fused Hydra models and of structurally pruned single models, run under
onnxruntime (CPU provider) and compared with torch, number for number (fp32, 1e-5): timm ViTs
in every tiny configuration, BERT/RoBERTa/MPNet/DistilBERT on padded batches of other sizes and
lengths than the traced one, zero-shot OpenCLIP towers, and the embedded defaults."""

from __future__ import annotations

import copy

import pytest
import torch

from hydra_core.export.onnx import (
    OnnxExportError,
    example_inputs,
    export_onnx,
    export_pruned_onnx,
    onnx_session,
    read_description,
    run_onnx,
)
from hydra_core.hydra import ensemble_probs, fuse_members, load_hydra, save_hydra
from hydra_core.hydra.layers import ACTIVATIONS_INPLACE
from hydra_core.models.adapter import ablate, prune_heads
from hydra_core.models.parts import ACTIVATIONS
from tests.conftest import (
    TEXT_KINDS,
    clip_images,
    make_tiny_text,
    make_tiny_vit,
    make_tiny_zero_shot,
    missing_data,
    random_mask,
    text_batch,
)
from tests.hydra.test_fused_clip import VARIANTS

ATOL = 1e-5


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=0, atol=ATOL)


def member_masks(layers: int = 3, heads: int = 4) -> list[torch.Tensor]:
    """Three masks with unequal head counts; member 1 keeps no head in layer 1."""
    masks = [random_mask((layers, heads), seed) for seed in range(3)]
    masks[0][:, 0] = True
    masks[1][1] = False
    masks[1][0, 1] = True
    masks[2][-1] = True
    return masks


def onnx_outputs(path, *inputs) -> tuple[torch.Tensor, torch.Tensor]:
    return run_onnx(onnx_session(path), inputs)


# --- timm ViTs ------------------------------------------------------------------------------------


def test_fused_vit_runs_in_onnxruntime_with_the_members_logits(tiny_vit, tmp_path):
    masks = member_masks()
    hydra = fuse_members([(tiny_vit, keep) for keep in masks])
    written = export_onnx(hydra, tmp_path / "hydra.onnx")
    assert written.max_difference < ATOL
    assert written.inputs == {"images": ("B", 1, 16, 16)}
    assert written.outputs == {"member_logits": ("B", 3, 5), "probs": ("B", 5)}
    images = torch.randn(7, 1, 16, 16, generator=torch.Generator().manual_seed(3))  # batch != 2
    logits, probs = onnx_outputs(tmp_path / "hydra.onnx", images)
    with torch.no_grad():
        assert_close(logits, hydra(images))
        for m, keep in enumerate(masks):  # each member as it runs alone, heads switched off
            with ablate(tiny_vit, keep):
                assert_close(logits[:, m], tiny_vit(images))
    assert_close(probs, ensemble_probs(logits))


def test_pruned_vit_runs_in_onnxruntime_like_prune_heads(tiny_vit, tmp_path):
    keep = member_masks()[1]  # a layer without heads
    written = export_pruned_onnx(tiny_vit, keep, tmp_path / "pruned.onnx")
    assert written.members == 1 and written.outputs["member_logits"] == ("B", 1, 5)
    images = torch.randn(5, 1, 16, 16, generator=torch.Generator().manual_seed(4))
    logits, probs = onnx_outputs(tmp_path / "pruned.onnx", images)
    with torch.no_grad():
        expected = prune_heads(tiny_vit, keep)(images)
    assert_close(logits[:, 0], expected)
    assert_close(probs, expected.softmax(-1))


def test_a_saved_finetuned_hydra_exports_as_it_loads(tmp_path):
    model = make_tiny_vit()
    members = []
    for seed, keep in enumerate(member_masks()):
        member = copy.deepcopy(model)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # a stand-in for fine-tuning: every weight nudged
            for p in member.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        members.append((member, keep))
    save_hydra(fuse_members(members), tmp_path / "hydra.safetensors", source="tiny")
    loaded = load_hydra(tmp_path / "hydra.safetensors")
    export_onnx(loaded, tmp_path / "hydra.onnx", description={"source": "tiny"})
    images = torch.randn(3, 1, 16, 16)
    with torch.no_grad():
        assert_close(onnx_outputs(tmp_path / "hydra.onnx", images)[0], loaded(images))
    description = read_description(tmp_path / "hydra.onnx")
    assert description["source"] == "tiny"
    assert description["kept_heads"] == [[list(h) for h in m] for m in loaded.kept_heads]


# --- text encoders --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TEXT_KINDS)
def test_fused_text_runs_in_onnxruntime_on_padded_batches(kind, tmp_path):
    model = make_tiny_text(kind, depth=3)
    masks = member_masks()
    hydra = fuse_members([(model, keep) for keep in masks])
    written = export_onnx(hydra, tmp_path / "hydra.onnx")
    assert written.inputs == {"input_ids": ("B", "T"), "attention_mask": ("B", "T")}
    assert written.max_difference < ATOL
    session = onnx_session(tmp_path / "hydra.onnx")
    for seed, batch, tokens in ((1, 1, 5), (2, 6, 12), (3, 9, 30)):  # traced: 2 x 8
        ids, mask = text_batch(seed, batch, tokens)
        ids[-1, -4:], mask[-1, -4:] = 1, 0  # a row padded past the others
        logits, probs = run_onnx(session, (ids, mask))
        with torch.no_grad():
            assert_close(logits, hydra(input_ids=ids, attention_mask=mask))
            for m, keep in enumerate(masks):
                with ablate(model, keep):
                    member = model(input_ids=ids, attention_mask=mask).logits
                assert_close(logits[:, m], member)
        assert_close(probs, ensemble_probs(logits))
    ids, mask = text_batch(4, 5, 10)
    alone = run_onnx(session, (ids[3:4, : int(mask[3].sum())], mask[3:4, : int(mask[3].sum())]))
    assert_close(run_onnx(session, (ids, mask))[0][3:4], alone[0])  # padding changes nothing


@pytest.mark.parametrize("kind", TEXT_KINDS)
def test_pruned_text_runs_in_onnxruntime_like_prune_heads(kind, tmp_path):
    model = make_tiny_text(kind, depth=3)
    keep = member_masks()[1]
    export_pruned_onnx(model, keep, tmp_path / "pruned.onnx")
    ids, mask = text_batch(5, 7, 15)
    logits, _ = onnx_outputs(tmp_path / "pruned.onnx", ids, mask)
    with torch.no_grad():
        expected = prune_heads(model, keep)(input_ids=ids, attention_mask=mask).logits
    assert_close(logits[:, 0], expected)


# --- zero-shot OpenCLIP -------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fused_zero_shot_clip_runs_in_onnxruntime(variant, tmp_path):
    model = make_tiny_zero_shot(**VARIANTS[variant])
    masks = member_masks()
    hydra = fuse_members([(model, keep) for keep in masks])
    written = export_onnx(hydra, tmp_path / "hydra.onnx")
    assert written.outputs == {"member_logits": ("B", 3, 5), "probs": ("B", 5)}
    images = clip_images(n=5, seed=2)
    logits, probs = onnx_outputs(tmp_path / "hydra.onnx", images)
    with torch.no_grad():
        for m, keep in enumerate(masks):
            with ablate(model, keep):
                assert_close(logits[:, m], model(images))
    assert_close(probs, ensemble_probs(logits))
    keep = masks[1]
    export_pruned_onnx(model, keep, tmp_path / "pruned.onnx")
    with torch.no_grad():
        expected = prune_heads(model, keep)(images)
    assert_close(onnx_outputs(tmp_path / "pruned.onnx", images)[0][:, 0], expected)


# --- the embedded defaults ------------------------------------------------------------------------


def load_default(name: str):
    from hydra_core.errors import InputError
    from hydra_core.zoo.registry import load_model

    try:
        return load_model(name)
    except (InputError, OSError) as error:
        missing_data(str(error))


def test_default_vit_hydra_runs_in_onnxruntime(tmp_path):
    loaded = load_default("default")
    masks = member_masks(6, 12)
    hydra = fuse_members([(loaded.model, keep) for keep in masks])
    export_onnx(hydra, tmp_path / "hydra.onnx")
    images = loaded.preprocess(torch.randint(0, 256, (16, 1, 28, 28), dtype=torch.uint8))
    logits, _ = onnx_outputs(tmp_path / "hydra.onnx", images)
    with torch.no_grad():
        for m, keep in enumerate(masks):
            with ablate(loaded.model, keep):
                assert_close(logits[:, m], loaded.model(images))
    export_pruned_onnx(loaded.model, masks[1], tmp_path / "pruned.onnx")
    with torch.no_grad():
        expected = prune_heads(loaded.model, masks[1])(images)
    assert_close(onnx_outputs(tmp_path / "pruned.onnx", images)[0][:, 0], expected)


def test_minilm_sentiment_hydra_runs_in_onnxruntime_on_padded_sentences(tmp_path):
    loaded = load_default("minilm-sentiment")
    masks = member_masks(6, 12)
    hydra = fuse_members([(loaded.model, keep) for keep in masks])
    export_onnx(hydra, tmp_path / "hydra.onnx", check=False)
    sentences = [
        "a gorgeous , witty , seductive movie .",
        "dull",
        "the plot is nothing but boilerplate clichés from start to finish , and the actors know it",
    ]
    packed = loaded.preprocess(sentences)  # padded to the preprocess' 64 tokens
    ids, mask = packed[:, 0], packed[:, 1]
    logits, _ = onnx_outputs(tmp_path / "hydra.onnx", ids, mask)
    with torch.no_grad():
        for m, keep in enumerate(masks):
            with ablate(loaded.model, keep):
                assert_close(logits[:, m], loaded.model(packed))
    export_pruned_onnx(loaded.model, masks[1], tmp_path / "pruned.onnx", check=False)
    with torch.no_grad():
        expected = prune_heads(loaded.model, masks[1])(packed)
    assert_close(onnx_outputs(tmp_path / "pruned.onnx", ids, mask)[0][:, 0], expected)


# --- what cannot be exported --------------------------------------------------------------------


@torch.library.custom_op("hydra_lab_test::softsign", mutates_args=())
def _softsign(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + x.abs())


def test_an_operator_without_an_onnx_form_is_one_line(tmp_path, monkeypatch, capfd):
    hydra = fuse_members([(make_tiny_vit(), keep) for keep in member_masks()])
    monkeypatch.setitem(ACTIVATIONS, "gelu", _softsign)  # an activation ONNX has no form of
    monkeypatch.setitem(ACTIVATIONS_INPLACE, "gelu", _softsign)
    with pytest.raises(OnnxExportError) as error:
        export_onnx(hydra, tmp_path / "hydra.onnx")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        "cannot export to ONNX: the operator hydra_lab_test::softsign has no ONNX form"
    )
    assert not (tmp_path / "hydra.onnx").exists()
    assert "graph" not in capfd.readouterr().out  # the exporter's dump of the graph is hidden


def test_export_onnx_takes_a_fused_model(tmp_path):
    with pytest.raises(TypeError, match="takes a fused Hydra model .* export_pruned_onnx"):
        export_onnx(make_tiny_vit(), tmp_path / "x.onnx")


def test_a_model_that_cannot_be_fused_cannot_be_exported_pruned(tmp_path):
    model = make_tiny_vit(act_layer=torch.nn.Tanh)
    with pytest.raises(OnnxExportError, match="cannot export to ONNX: this model cannot be fused"):
        export_pruned_onnx(model, member_masks()[0], tmp_path / "pruned.onnx")


def test_example_text_inputs_are_padded_rows_of_real_tokens():
    hydra = fuse_members([(make_tiny_text("roberta", depth=2), torch.ones(2, 4, dtype=torch.bool))])
    ids, mask = example_inputs(hydra, batch=4, tokens=9, seed=1)
    assert mask[0].all() and not mask.all()  # the first row full, another padded
    assert (ids[mask == 0] == 1).all() and (ids[mask == 1] != 1).all()  # RoBERTa pads with 1
