"""The head analyses, member strategies, evaluation, cost and fine-tuning on Hugging Face text
classifiers: each against a plain computation on the HF model itself, on ragged padded batches."""

from __future__ import annotations

import zlib
from contextlib import ExitStack

import pytest
import torch
import torch.nn.functional as F

from hydra_core.analysis.cahp import cahp_select
from hydra_core.analysis.cahp_official import keep_one_per_layer
from hydra_core.analysis.inputs import SearchInputs
from hydra_core.analysis.representations import (
    centroid_distances,
    distance_table_dense_vs_circuit,
    head_cls_features,
)
from hydra_core.analysis.taylor import taylor_prune, taylor_scores
from hydra_core.data.text import TextSet
from hydra_core.evaluate import evaluate_model
from hydra_core.hydra.cost import (
    ModelShape,
    cost_table,
    count_macs,
    count_params,
    formula_macs,
    parameter_breakdown,
)
from hydra_core.hydra.finetune import (
    FinetuneConfig,
    finetune_member,
    parameter_group,
    select_finetune_config,
)
from hydra_core.hydra.members import (
    TAYLOR_NAME,
    cahp_members,
    greedy_ranking,
    manual_members,
    member_overlap,
    seed_sampled_members,
    taylor_member,
    taylor_ranking,
)
from hydra_core.inference import predict
from hydra_core.models.adapter import (
    ablate,
    head_layout,
    prune_heads,
    record_head_outputs,
)
from hydra_core.models.text import TextClassifier, pack
from tests.conftest import make_tiny_text, random_mask, text_batch

D, LAYERS, HEADS, DK, HIDDEN, CLASSES, VOCAB, POSITIONS = 24, 2, 4, 6, 48, 3, 60, 40
#: HF module names of the tiny models' Q, K, V and W_O, to compute references without the seam
QKVO = {
    "bert": ("attention.self.query", "attention.self.key", "attention.self.value"),
    "mpnet": ("attention.attn.q", "attention.attn.k", "attention.attn.v"),
}
OUT = {"bert": "attention.output.dense", "mpnet": "attention.attn.o"}


def _get(module, path):
    for part in path.split("."):
        module = getattr(module, part)
    return module


def padded(seed: int, batch: int, tokens: int, extra: int = 4) -> torch.Tensor:
    """Packed ragged inputs with ``extra`` padding columns that no sample uses."""
    ids, mask = text_batch(seed, batch, tokens)
    ids = torch.cat([ids, torch.ones(batch, extra, dtype=torch.long)], 1)
    mask = torch.cat([mask, torch.zeros(batch, extra, dtype=torch.long)], 1)
    return pack(ids, mask)


def hf_logits(model, x: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x[:, 0], attention_mask=x[:, 1]).logits


def zero_heads(model, kind: str, keep: torch.Tensor) -> list:
    """The plain reference for ablation: a pre-hook on each W_O zeroing the removed heads."""
    handles = []
    blocks = getattr(model, kind).encoder.layer
    for layer, block in enumerate(blocks):
        channels = keep[layer].repeat_interleave(DK).double()

        def hook(module, args, channels=channels):
            return (args[0] * channels.to(args[0].dtype),)

        handles.append(_get(block, OUT[kind]).register_forward_pre_hook(hook))
    return handles


# --- Taylor -----------------------------------------------------------------------------------


def reference_taylor(model, kind: str, x, y, keep=None) -> torch.Tensor:
    """|W * dL/dW| averaged over each head's rows of Q, K and V, by autograd on the HF model."""
    blocks = getattr(model, kind).encoder.layer
    weights = [_get(block, path).weight for block in blocks for path in QKVO[kind]]
    handles = [] if keep is None else zero_heads(model, kind, keep)
    try:
        loss = F.cross_entropy(hf_logits(model, x), y)
        grads = torch.autograd.grad(loss, weights)
    finally:
        for handle in handles:
            handle.remove()
    scores = torch.zeros(LAYERS, HEADS, dtype=torch.float64)
    for i, (w, g) in enumerate(zip(weights, grads, strict=True)):
        per_head = (w * g).abs().reshape(HEADS, DK, D).mean(dim=(1, 2))  # (H,)
        scores[i // 3] += per_head / 3
    if keep is not None:
        scores[~keep] = float("nan")
    return scores.float()


@pytest.mark.parametrize("kind", ["bert", "mpnet"])
@pytest.mark.parametrize("masked", [False, True])
def test_taylor_scores_equal_autograd_on_the_hf_model(kind, masked):
    model = make_tiny_text(kind).double()
    x, y = padded(0, 10, 12), torch.arange(10) % CLASSES
    keep = random_mask((LAYERS, HEADS), 3) if masked else None
    expected = reference_taylor(model, kind, x, y, keep)
    got = taylor_scores(model, x, y, keep=keep, batch_size=4)  # ragged batches of 4, 4, 2
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-9, equal_nan=True)
    as_pair = taylor_scores(TextClassifier(model), (x[:, 0], x[:, 1]), y, keep=keep)
    torch.testing.assert_close(as_pair, expected, rtol=1e-5, atol=1e-9, equal_nan=True)
    assert all(p.grad is None for p in model.parameters())


def test_taylor_prune_on_text():
    model = make_tiny_text("bert").double()
    x, y = padded(1, 8, 10), torch.arange(8) % CLASSES
    result = taylor_prune(model, x, y, heads_to_prune_per_layer=[1, 2])
    assert result.keep.sum(1).tolist() == [3, 2]
    first = reference_taylor(model, "bert", x, y)[0]
    torch.testing.assert_close(result.scores[0], first, rtol=1e-5, atol=1e-9)
    assert result.pruned[0] == (0, int(first.argmin()))


# --- per-head representations ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bert", "roberta", "mpnet", "distilbert"])
def test_head_features_equal_recorded_outputs_of_the_hf_forward(kind):
    model = make_tiny_text(kind).double()
    x = padded(2, 7, 11)
    keep = random_mask((LAYERS, HEADS), 5)
    for mask in (None, keep):
        with ExitStack() as stack:
            if mask is not None:
                stack.enter_context(ablate(model, mask))  # first, so recorded heads read zero
            store = stack.enter_context(record_head_outputs(model, [0, 1]))
            stack.enter_context(torch.no_grad())
            hf_logits(model, x)
        got = head_cls_features(model, x, keep=mask, batch_size=3)  # (N, L, H, d_k)
        for layer in (0, 1):
            torch.testing.assert_close(got[:, layer], store[layer][0].float())
    last = head_cls_features(model, x, layers=[-1], keep=keep)
    torch.testing.assert_close(last[:, 0], got[:, 1])


@pytest.mark.parametrize("kind", ["bert", "mpnet"])
def test_head_features_do_not_depend_on_padding(kind):
    model = make_tiny_text(kind).double()
    x = padded(3, 6, 12, extra=6)
    batch = head_cls_features(model, x)
    for i in range(len(x)):
        length = int(x[i, 1].sum())
        alone = head_cls_features(model, x[i : i + 1, :, :length])  # no padding at all
        torch.testing.assert_close(alone[0], batch[i], rtol=1e-6, atol=1e-7)


def test_centroid_distances_and_dense_vs_circuit_on_text():
    model = make_tiny_text("bert")
    id_x, ood_x = padded(4, 12, 10), padded(5, 9, 14)
    keep = torch.ones(LAYERS, HEADS, dtype=torch.bool)
    keep[1, 2] = keep[0, 0] = False
    table = centroid_distances(head_cls_features(model, id_x), head_cls_features(model, ood_x))
    assert len(table) == LAYERS * HEADS and (table["euclidean"] > 0).all()
    frame = distance_table_dense_vs_circuit(model, keep, id_x, {"ood": ood_x})
    assert list(frame["dataset"]) == ["ood", "Average"]
    assert frame.attrs["heads"] == ["L1H0", "L1H1", "L1H3"]
    dense = distance_table_dense_vs_circuit(
        model, torch.ones(LAYERS, HEADS, dtype=torch.bool), id_x, {"ood": ood_x}
    )
    assert (dense["delta_euclidean"] == 0).all() and (dense["delta_mahalanobis"] == 0).all()


# --- CAHP and the member strategies ---------------------------------------------------------


def test_cahp_on_a_raw_hf_model():
    model = make_tiny_text("bert")
    x, y = padded(6, 18, 10), torch.arange(18) % CLASSES
    result = cahp_select(
        model, x, y, variant="accuracy-knee", k_grid=[1, 3, 5, 8], degree=2, batch_size=7
    )
    assert result.curve["k"].tolist() == [1, 3, 5, 8]
    kept = sorted(map(tuple, result.keep.nonzero().tolist()))
    assert kept == sorted(result.representatives + result.added)
    for k, accuracy in zip(result.curve["k"], result.curve["accuracy"], strict=True):
        medoids = result.medoids[k]
        guard = keep_one_per_layer(
            [result.heads.index(h) for h in medoids], result.heads, result.importance
        )
        keep = torch.zeros(LAYERS, HEADS, dtype=torch.bool)
        for layer, head in medoids + [result.heads[i] for i in guard]:
            keep[layer, head] = True
        with ablate(model, keep), torch.no_grad():
            expected = (hf_logits(model, x).argmax(-1) == y).float().mean().item()
        assert accuracy == pytest.approx(expected)


@pytest.fixture(scope="module")
def search_inputs() -> SearchInputs:
    id_x, ood_x = padded(7, 16, 10), padded(8, 16, 13)
    return SearchInputs(id_x, torch.arange(16) % CLASSES, ood_x, {"ood": ood_x})


def test_member_strategies_on_text(search_inputs):
    model = make_tiny_text("bert", depth=3)
    layout = head_layout(model)
    ranking = taylor_ranking(model, search_inputs, samples=None)
    assert sorted(ranking) == sorted((layer, h) for layer in range(3) for h in range(HEADS))
    members = seed_sampled_members(
        ranking, layout, budget=4, seeds=[0, 1, 2], ranking_name=TAYLOR_NAME, pool=8
    )
    overlap = member_overlap(members)
    assert all(int(m.keep.sum()) == 8 for m in members)
    assert 0 <= overlap["mean_pairwise_jaccard"] < 1
    circuit = greedy_ranking(model, search_inputs, objective="avg", budget=3)
    assert len(circuit) == 12
    taylor = taylor_member(model, search_inputs, per_layer=1, samples=None)
    assert taylor.keep.sum(1).tolist() == [3, 3, 3]
    cahp = cahp_members(
        model,
        search_inputs,
        seeds=[0, 1],
        variant="accuracy-knee",
        k_grid=[1, 4, 8, 12],
        degree=2,
        allow_identical=True,
    )
    assert [m.name for m in cahp] == ["CAHP accuracy-knee seed 0", "CAHP accuracy-knee seed 1"]
    assert all(f"{int(m.keep.sum())} heads kept" in m.source for m in cahp)
    by_hand = manual_members([members[0].keep, taylor.keep], layout)
    assert member_overlap(by_hand)["jaccard"].shape == (2, 2)


# --- prediction and evaluation of sets of texts ---------------------------------------------


def word_ids(texts, length: int = 12) -> torch.Tensor:
    """A stand-in tokenizer: a class token, one id per word, padding to ``length``."""
    ids = torch.ones(len(texts), length, dtype=torch.long)
    mask = torch.zeros(len(texts), length, dtype=torch.long)
    for i, text in enumerate(texts):
        row = [0] + [3 + zlib.crc32(w.encode()) % (VOCAB - 3) for w in text.split()]
        row = row[:length]
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return pack(ids, mask)


def texts(n: int, seed: int) -> tuple[str, ...]:
    g = torch.Generator().manual_seed(seed)
    words = ["good", "bad", "film", "plot", "dull", "fun", "long", "great", "the", "a", "not"]
    lengths = torch.randint(1, 10, (n,), generator=g).tolist()
    return tuple(
        " ".join(words[j] for j in torch.randint(0, len(words), (k,), generator=g).tolist())
        for k in lengths
    )


def test_predict_takes_a_tuple_of_texts():
    model = make_tiny_text("mpnet")
    sentences = texts(11, 0)
    seen = []

    def preprocess(batch):
        seen.append(batch)
        return word_ids(batch)

    got = predict(TextClassifier(model), sentences, preprocess, batch_size=4)
    assert [len(b) for b in seen] == [4, 4, 3] and all(isinstance(b, tuple) for b in seen)
    with torch.no_grad():
        torch.testing.assert_close(got, hf_logits(model, word_ids(sentences)), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="no inputs"):
        predict(TextClassifier(model), (), preprocess)


def test_evaluate_a_raw_hf_model_on_text_sets():
    model = make_tiny_text("bert")
    id_set = TextSet("reviews", texts(20, 1), torch.arange(20) % CLASSES)
    ood = TextSet("news", texts(15, 2), group="far")
    keep = random_mask((LAYERS, HEADS), 7)
    evaluation = evaluate_model(model, word_ids, id_set, [ood], keep=keep, device="cpu")
    with ablate(model, keep), torch.no_grad():
        expected = hf_logits(model, word_ids(id_set.texts))
    torch.testing.assert_close(evaluation.id.logits, expected, atol=1e-5, rtol=0)
    assert evaluation.table().loc[1, "set"] == "news"


# --- cost -----------------------------------------------------------------------------------


def test_parameters_of_a_tiny_bert_by_hand():
    model = make_tiny_text("bert")
    embedding = VOCAB * D + POSITIONS * D + 2 * D + 2 * D  # words, positions, 2 types, LayerNorm
    attention = 4 * D * D  # Q, K, V, W_O
    mlp = 2 * D * HIDDEN
    head = (D * D + D) + (D * CLASSES + CLASSES)  # the pooler, the classifier
    parts = parameter_breakdown(model)
    assert parts == {
        "embedding": embedding,
        "layer norms": LAYERS * 2 * 2 * D,
        "attention weights": LAYERS * attention,
        "attention biases": LAYERS * 4 * D,
        "MLP weights": LAYERS * mlp,
        "MLP biases": LAYERS * (HIDDEN + D),
        "classifier": head,
    }
    assert sum(parts.values()) == count_params(model)
    assert parameter_breakdown(TextClassifier(model)) == parts
    pruned = prune_heads(model, random_mask((LAYERS, HEADS), 1))
    assert sum(parameter_breakdown(pruned).values()) == count_params(pruned)


@pytest.mark.parametrize("kind", ["bert", "roberta", "mpnet", "distilbert"])
def test_formula_macs_equal_counted_macs_on_text(kind):
    model = make_tiny_text(kind)
    x = padded(9, 3, 12)
    shape = ModelShape.of(model, x)
    assert shape.num_tokens == 12 and shape.stem_macs == 0  # unused padding columns dropped
    assert count_macs(model, x) == 3 * formula_macs(shape, [[HEADS] * LAYERS])
    keep = torch.tensor([[True, False, True, False], [False] * HEADS])
    heads = keep.sum(1).tolist()
    assert count_macs(prune_heads(model, keep), x) == 3 * formula_macs(shape, [heads])


def test_cost_table_runs_raw_hf_members_on_packed_inputs():
    model = make_tiny_text("bert")
    members = [prune_heads(model, random_mask((LAYERS, HEADS), s)) for s in range(2)]
    x = padded(10, 4, 10)
    table = cost_table({"single": [model], "members": members}, x, warmup=0, repeats=1)
    assert table.loc["single", "macs"] == count_macs(model, x)
    assert table.loc["members", "params"] == sum(count_params(m) for m in members)
    assert table.loc["members", "macs_ratio"] < 2


# --- fine-tuning ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def train_set() -> TextSet:
    return TextSet("train", texts(24, 3), torch.arange(24) % CLASSES)


def test_finetune_a_text_member(train_set):
    model = make_tiny_text("bert")
    keep = torch.tensor([[True, False, True, True], [False, True, False, False]])
    config = FinetuneConfig(n_train=16, batch_size=8, steps=2, warmup_steps=0, lr=0.05)
    member = finetune_member(model, keep, config, preprocess=word_ids, train_set=train_set)
    assert head_layout(member.model).num_heads == (3, 1)
    start = dict(prune_heads(model, keep).named_parameters())
    trained = set(config.trainable)
    for name, p in member.model.named_parameters():
        changed = not torch.equal(p, start[name])
        group = parameter_group(name, member.model)
        assert changed == (group in trained), name
    assert not member.model.training
    # no training set: the text modality's embedded one, Rotten Tomatoes' training sentences
    default = finetune_member(model, keep, config, preprocess=word_ids)
    assert head_layout(default.model).num_heads == (3, 1)
    assert not torch.equal(default.model.classifier.weight, member.model.classifier.weight)


def test_select_finetune_config_on_text(train_set):
    model = make_tiny_text("bert")
    keep = random_mask((LAYERS, HEADS), 2)
    base = FinetuneConfig(n_train=12, batch_size=6, steps=1, warmup_steps=0)
    validation = TextSet("validation", texts(10, 4), torch.arange(10) % CLASSES)
    selection = select_finetune_config(
        model,
        keep,
        base,
        preprocess=word_ids,
        grid={"lr": (0.001, 0.05)},
        train_set=train_set,
        validation_set=validation,
    )
    assert selection.table["lr"].tolist() == [0.001, 0.05] and selection.n_validation == 10
    with pytest.raises(ValueError, match="validation texts are also among"):
        select_finetune_config(
            model,
            keep,
            base,
            preprocess=word_ids,
            grid={"lr": (0.01,)},
            train_set=train_set,
            validation_set=train_set,
        )
