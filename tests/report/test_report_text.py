"""``python -m hydra_core report --task text --quick`` on a tiny local BERT, and the parts of the
text report that do more than bookkeeping (MC Dropout, Deep Ensembles' shared encoder, training
the top of a model, the verdicts against the paper)."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest
import torch
import transformers

from hydra_core.baselines.mc_dropout import MCDropout
from hydra_core.baselines.shared_backbone import (
    DEEP,
    DEEP_HEADS,
    SharedBackboneEnsemble,
    sharing_copy,
)
from hydra_core.baselines.systems import MC_DROPOUT
from hydra_core.cli import main
from hydra_core.data.text import TextSet
from hydra_core.hydra.cost import count_params
from hydra_core.models.adapter import prune_heads
from hydra_core.models.preprocess import TrimmedPreprocess
from hydra_core.models.text import TextClassifier, TextPreprocess
from hydra_core.report.claims import verdict as claim_verdict
from hydra_core.report.text_config import FINETUNE
from hydra_core.report.text_tables import SINGLE, paper_table2
from hydra_core.training.top import finetune_top

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + (
    "the a an and of to is it in that this film movie story good bad great funny dull not "
    "but with as its for on be are one all more like best worst love boring fun"
).split()
SECTIONS = [
    "## Setup",
    "## Summary",
    "## The CircAvg circuit",
    "## Stability of the circuits",
    "## Per-head evidence",
    "## Table 2",
    "## Table 17",
    "## Tables 18-20",
    "## Differences to the single model",
    "## Agreements and disagreements with the paper",
    "## Fused vs separately run members",
    "## Cost",
    "## What this report covers",
]
CSVS = [
    "table2_systems",
    "table17_near_far",
    "per_set",
    "differences_to_single",
    "paper_table2",
    "paper_claims",
    "heads_per_layer",
    "circuit",
    "fusion_check",
    "table7_cost",
    "summary_all_systems",
    "all_sets",
    "training",
    "repeats",
    "stability",
    "heads",
]
ROWS = [
    SINGLE,
    DEEP,
    MC_DROPOUT,
    "Taylor",
    "CircAvg",
    "Hydra (Taylor) (fused)",
    "Hydra (Circ) (fused)",
    "Hydra (Circ, B.5) (fused)",
    "Taylor (fine-tuned)",
    "CircAvg (fine-tuned)",
    "Hydra (Taylor), fine-tuned (fused)",
    "Hydra (Circ), fine-tuned (fused)",
    "Hydra (Circ, B.5), fine-tuned (fused)",
]


def tiny_sentiment_bert(seed: int = 0) -> transformers.BertForSequenceClassification:
    """A random 3-layer, 4-head BERT with two classes, like minilm-sentiment in miniature."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=len(WORDS),
        hidden_size=24,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=40,
        num_labels=2,
    )
    config.id2label, config.label2id = (
        {0: "negative", 1: "positive"},
        {"negative": 0, "positive": 1},
    )
    return transformers.BertForSequenceClassification(config).eval()


def tokenizer() -> transformers.BertTokenizer:
    return transformers.BertTokenizer(
        vocab={w: i for i, w in enumerate(WORDS)}, model_max_length=32
    )


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("text-report")
    tiny_sentiment_bert().save_pretrained(root / "tiny")
    tokenizer().save_pretrained(root / "tiny")
    out = root / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HYDRA_LAB_CACHE", str(root / "cache"))
        args = ["report", "--task", "text", "--quick", "--model", str(root / "tiny")]
        args += ["--ood", "imdb", "abc_news", "--device", "cpu", "--out", str(out)]
        assert main(args) == 0
    return out


def test_every_file_and_section(report_dir):
    for name in ["report.md", "report.json", "members.json", *(f"{c}.csv" for c in CSVS)]:
        assert (report_dir / name).is_file(), name
    text = (report_dir / "report.md").read_text()
    positions = [text.index(s) for s in SECTIONS]
    assert positions == sorted(positions)
    assert "[" in text and "verdict (fine-tuned)" in text


def test_json_protocol_intervals_and_rows(report_dir):
    report = json.loads((report_dir / "report.json").read_text())
    protocol = report["setup"]["protocol"]
    assert protocol["search_ood"] == ["guardian"]
    assert protocol["report_ood"] == ["imdb", "abc_news"]  # the search set is never reported
    assert protocol["id_report_n"] == 24 and protocol["id_search_n"] == 16
    assert protocol["seeds"]["mc_dropout"] == [0, 1]
    rows = {r["system"]: r for r in report["table2_systems"]}
    assert list(rows) == ROWS
    for row in rows.values():
        for metric in ("accuracy", "nll", "ece", "all_auroc", "all_fpr95"):
            value, (lo, hi) = row[metric]["value"], row[metric]["ci95"]
            assert lo - 1e-9 <= value <= hi + 1e-9, (row["system"], metric)
    assert rows["Taylor"]["heads"] == "6" and rows["Hydra (Circ) (fused)"]["heads"] == "6x3"
    assert rows["Taylor"]["nll"]["value"] != rows[SINGLE]["nll"]["value"]  # its own predictions
    assert rows["Taylor"]["trained_after_pruning"] == "no"
    assert rows["Taylor (fine-tuned)"]["trained_after_pruning"] == "yes"
    differences = {r["system"] for r in report["differences_to_single"]}
    assert set(rows) - {SINGLE} <= differences
    all_sets = pd.read_csv(report_dir / "all_sets.csv")
    assert "guardian" not in set(all_sets["set"])


def test_verdicts_are_taken_over_the_repeats(report_dir):
    """Two repeats (quick): every claim's value is the mean of the repeats' differences, each
    repeat with its own searches, pruning seeds and fine-tuning seed."""
    setup = json.loads((report_dir / "report.json").read_text())["setup"]
    assert setup["protocol"]["seeds"]["pruning_per_repeat"] == [[0, 1, 2], [3, 4, 5]]
    repeats = pd.read_csv(report_dir / "repeats.csv")
    assert sorted(repeats["repeat"].unique()) == [0, 1]
    by = repeats.set_index(["repeat", "system"])
    claims = pd.read_csv(report_dir / "paper_claims.csv").set_index("claim")
    row = claims.loc["Hydra (Circ) raises OOD AUROC"]
    hydra, single = "Hydra (Circ), fine-tuned (fused)", SINGLE
    expected = (
        100
        * sum(by.loc[(r, hydra), "all_auroc"] - by.loc[(r, single), "all_auroc"] for r in (0, 1))
        / 2
    )
    assert row["fine_tuned"] == pytest.approx(expected, abs=1e-9)
    assert row["fine_tuned_lo"] <= row["fine_tuned"] <= row["fine_tuned_hi"]
    # the seeded systems differ between repeats; the single model does not
    assert by.loc[(0, single), "all_auroc"] == by.loc[(1, single), "all_auroc"]


def test_heads_per_layer_and_fusion(report_dir):
    heads = pd.read_csv(report_dir / "heads_per_layer.csv").set_index("layer")
    assert heads.loc["total"].tolist() == [6] * len(heads.columns)
    assert heads.drop(index="total")["Taylor-6"].tolist() == [2, 2, 2]  # 2 of 4 per layer
    fusion = pd.read_csv(report_dir / "fusion_check.csv").set_index("system")
    assert fusion.loc["Hydra (Circ)", "max_prob_diff"] < 1e-5  # zero-shot: fused = members
    cost = pd.read_csv(report_dir / "table7_cost.csv").set_index("system")
    assert cost.loc[DEEP, "params"] < 2 * cost.loc[SINGLE, "params"]  # one shared encoder
    assert cost.loc[MC_DROPOUT, "macs"] == 2 * cost.loc[SINGLE, "macs"]  # two passes


# --- the parts --------------------------------------------------------------------------------


def texts_and_preprocess(n: int = 12):
    words = WORDS[5:]
    g = torch.Generator().manual_seed(0)
    sentences = tuple(
        " ".join(words[i] for i in torch.randint(len(words), (int(k),), generator=g))
        for k in torch.randint(2, 12, (n,), generator=g)
    )
    labels = torch.arange(n) % 2
    data = TextSet("tiny", sentences, labels, classes=("negative", "positive"))
    return data, TextPreprocess(tokenizer(), max_length=16)


def test_trimmed_preprocess_changes_no_logit():
    data, preprocess = texts_and_preprocess()
    model = TextClassifier(tiny_sentiment_bert())
    trimmed = TrimmedPreprocess(preprocess)(data.texts)
    assert trimmed.shape[-1] < preprocess(data.texts).shape[-1]
    with torch.no_grad():
        torch.testing.assert_close(model(trimmed), model(preprocess(data.texts)), atol=1e-5, rtol=0)


def test_mc_dropout_is_seeded_varies_by_pass_and_restores_the_model():
    data, preprocess = texts_and_preprocess()
    model = TextClassifier(tiny_sentiment_bert())
    x = preprocess(data.texts)
    state = torch.random.get_rng_state()
    with torch.no_grad():
        first, second = MCDropout(model, passes=3)(x), MCDropout(model, passes=3)(x)
        plain = model(x)
    assert first.shape == (len(x), 3, 2)
    torch.testing.assert_close(first, second, atol=0, rtol=0)  # the same seeds, the same masks
    assert not torch.allclose(first[:, 0], first[:, 1])  # passes differ
    assert not torch.allclose(first[:, 0], plain)  # dropout was on
    assert not any(m.training for m in model.modules())  # back in eval mode
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random state kept


def test_shared_prefix_ensemble_stores_the_prefix_once_and_runs_each_copy():
    data, preprocess = texts_and_preprocess()
    model = TextClassifier(tiny_sentiment_bert())
    copies = [model, sharing_copy(model, 1), sharing_copy(model, 1)]
    with torch.no_grad():
        for i, twin in enumerate(copies[1:], start=1):
            for name, p in twin.named_parameters():
                if "encoder.layer.2." in name or "classifier" in name:
                    p.add_(0.05 * i * torch.randn_like(p))
    assert copies[1].hf.bert.encoder.layer[0] is not model.hf.bert.encoder.layer[0]
    assert copies[1].hf.bert.encoder.layer[0].attention.self.query.weight is (
        model.hf.bert.encoder.layer[0].attention.self.query.weight
    )
    deep = SharedBackboneEnsemble(copies, shared=1)
    shared = count_params(model.hf.bert.embeddings) + count_params(model.hf.bert.encoder.layer[0])
    assert count_params(deep) == 3 * count_params(model) - 2 * shared
    x = preprocess(data.texts)
    with torch.no_grad():
        logits = deep(x)
        expected = torch.stack([c(x) for c in copies], dim=1)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    assert not torch.allclose(logits[:, 0], logits[:, 2])


def test_finetune_top_trains_only_the_top_and_leaves_the_source_alone():
    data, preprocess = texts_and_preprocess(24)
    model = TextClassifier(tiny_sentiment_bert())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[0, 1] = keep[2, 3] = False
    reference = prune_heads(model, keep).state_dict()
    config = replace(FINETUNE, trained_layers=1, steps=3, batch_size=8, lr=1e-2, n_validation=None)
    tuned = finetune_top(model, data, config, preprocess=preprocess, keep=keep).model
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    changed = {k for k, v in tuned.state_dict().items() if not torch.equal(v, reference[k])}
    assert any("encoder.layer.2." in k for k in changed) and any("classifier" in k for k in changed)
    assert all("encoder.layer.2." in k or "pooler" in k or "classifier" in k for k in changed)


def test_deep_heads_config_and_paper_numbers():
    assert DEEP_HEADS.trained_layers == 0 and DEEP_HEADS.reinit_head
    paper = paper_table2().set_index("system")
    assert paper.loc["Hydra (Circ)", "all_auroc"] == 77.60
    assert paper.loc["Single", "far_fpr95"] == 63.62 and paper.loc["Taylor", "heads"] == "6"


@pytest.mark.parametrize(
    ("paper", "value", "lo", "hi", "verdict"),
    [
        (2.0, 1.0, 0.5, 1.5, "agrees"),
        (2.0, -1.0, -1.5, -0.5, "disagrees"),
        (-2.0, -1.0, -1.5, 0.5, "same direction, n.s."),
        (-2.0, 1.0, -0.5, 1.5, "opposite direction, n.s."),
        (0.0, 1.0, 0.5, 1.5, "–"),
        (-0.12, 0.0, 0.0, 0.0, "no difference"),
    ],
)
def test_verdicts(paper, value, lo, hi, verdict):
    assert claim_verdict(paper, value, lo, hi) == verdict
