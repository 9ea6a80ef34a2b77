"""The text report's ``report.md``, written from its tables and setup alone
(:func:`text_markdown`): setup, the paper's headline statements against this run, the CircAvg
circuit, Table 2 with Tables 17-20, the agreements with the paper, fusion and cost, and what of
the paper's text experiments the report covers."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from hydra_core.report.claims import (
    CIRCAVG,
    INTERVAL_METHOD,
    PERCENT,
    near_far_verdicts,
    paper_frame,
    signed,
    verdict_counts,
)
from hydra_core.report.heads import heads_section
from hydra_core.report.markdown import cost_columns, jaccard_text, markdown_table
from hydra_core.report.stability import stability_section


def text_markdown(tables: Mapping[str, pd.DataFrame], setup: dict) -> str:
    """The text of the text report's ``report.md``, from its tables and setup alone."""
    return "\n".join(
        [
            *_setup_section(setup),
            *_summary_section(tables),
            *_circuit_section(tables, setup),
            *stability_section(tables.get("stability"), markdown_table),
            *heads_section(tables.get("heads")),
            *_table2_section(tables, setup),
            *_claims_section(tables["paper_claims"], setup, tables.get("repeats")),
            *_fusion_cost_section(tables, setup),
            *_coverage_section(setup),
        ]
    )


DEFAULT_COMMAND = "python -m hydra_core report --task text"


def _setup_section(setup: dict) -> list[str]:
    """Title, model and scale, data and protocol, budgets, members, baselines, training, metrics."""
    model, b, p = setup["model"], setup["budgets"], setup["protocol"]
    data = pd.DataFrame(setup["data"])
    data["description"] = data["name"].map(setup["data_descriptions"])
    seconds = pd.DataFrame(list(setup["seconds"].items()), columns=["stage", "seconds"])
    kept = model["heads"] - b["removed_per_layer"]
    jaccard = ", ".join(
        f"{k} {jaccard_text(v['mean_pairwise_jaccard'])}"
        for k, v in setup["member_overlap"].items()
    )
    search, report = ", ".join(p["search_ood"]), ", ".join(p["report_ood"])
    ft, config = setup["finetune"], setup["config"]
    return [
        "# Hydra Ensembles on text: the paper's Table 2 on the offline text default",
        "",
        f"Generated {setup['created']} by `{setup['command'] or DEFAULT_COMMAND}` in"
        f" {setup['total_seconds'] / 60:.1f} minutes on {setup['machine']} ({setup['device']}). "
        "Every number below was measured by this run, except the paper's own numbers, which are "
        "labelled as such. Where ours disagree with the paper's, they are reported as they came "
        "out.",
        "",
        "## Setup",
        "",
        f"- **Model**: `{model['name']}`: {setup['model_description']}; {model['layers']} layers x "
        f"{model['heads']} heads (head dim {model['head_dim']}, width {model['embed_dim']}), "
        f"{model['params']:,} parameters.",
        "- **Scale**: the paper's Table 2 is bert-base-uncased (12 layers x 12 heads, width 768, "
        "110M parameters) with every layer fine-tuned on SST-2's 67k training sentences, tested on "
        "SST-2's 872 validation sentences; ours is a model a fifth of its size with its top two "
        "layers fine-tuned on 6,030 Rotten Tomatoes sentences (the source SST was built from), "
        "tested on the Rotten Tomatoes test split, with other OOD sets. Effects are compared by "
        "direction, not by size.",
        f"- **Data**: heads are selected on {p['id_search_n']:,} Rotten Tomatoes validation "
        f"sentences and the *search* OOD set ({search}: news headlines, as the paper's AG's News), "
        f"which no table uses; every table is computed on the {p['id_report_n']:,} Rotten Tomatoes "
        f"test sentences and the *report* OOD sets ({report}), {_sizes(p['report_n'])}, as the "
        "paper extracts circuits against a dedicated OOD set excluded from its tables (D.1.2). "
        "Every metric carries a 95% bootstrap interval over the report sentences, shown as value "
        "[lo, hi] (stratified: ID resampled within each class, each OOD set within itself); "
        "differences between systems use paired resamples.",
        "",
        markdown_table(data[["name", "role", "group", "n_search", "n_report", "description"]]),
        "",
        f"- **Sizes**: {_sizes_sentence(setup)}",
        f"- **Budgets**: every pruned model and every member removes {b['budget']} of "
        f"{b['total']} heads. Taylor removes {b['removed_per_layer']} per layer ({kept} of "
        f"{model['heads']} kept, the paper's 6 of 12), layer-wise first-order Taylor pruning "
        f"(D.1.1, {config['taylor_samples'] or p['id_search_n']} ID search sentences). "
        "CircAvg: the greedy Headmap "
        f"search (Algorithm 1) with the objective S_avg = (accuracy + AUROC) / 2, removing "
        f"{b['budget']} heads in all; a circuit need not keep as many heads in every layer (see "
        "below).",
        "- **Members**: **Hydra (Circ)** is the paper's method (B.2 question 3, D.3): one circuit "
        "per criterion, CircAcc, CircOOD and CircAvg, each from its own greedy search with the "
        "same budget. **Hydra (Circ, B.5)** is the paper's B.5 ablation with one circuit: M = "
        f"{setup['members']} members (pruning seeds {p['seeds']['pruning']}), each pruning "
        f"{b['budget']} heads drawn at random from the {b['pool']} least useful heads of the "
        'CircAvg ranking (the paper\'s "48 of 100"); **Hydra (Taylor)** draws them in the same way '
        "from the Taylor global ranking; heads beyond the search's steps are ranked "
        f"by their score in its last step. Mean pairwise Jaccard of the kept heads: {jaccard}. "
        "Members are fused into one model (fuse_members); the ensemble averages the members' "
        "probabilities.",
        f"- **Deep Ensembles (D)**: {_deep_sentence(setup)}",
        f"- **MC Dropout**: the model's own dropout layers on at test time, T = "
        f"{config['mc_passes']} passes with seeds {p['seeds']['mc_dropout']} (each re-seeded at "
        "every batch), probabilities averaged.",
        f"- **Fine-tuning after pruning**: {_finetune_sentence(ft)}",
        "- **Metrics** (docs/metrics.md): ECE with 15 equal-width bins, aECE with 15 "
        "equal-mass bins, Brier summed over the classes; OOD score = maximum softmax probability, "
        "OOD is the positive class: AUROC, FPR95 (share of ID flagged OOD when 95% of OOD is "
        "caught), AUPR-In / AUPR-Out (the paper's AUPR is AUPR-Out; both depend on the ratio of "
        "OOD to ID sentences, so neither compares across setups); near/far/all averages are "
        "unweighted means over the OOD sets of the group. MI = mutual information H(mean p) - "
        "mean H(p_m) of ensembles. Accuracy and OOD metrics in percent.",
        "- **Speed**: report sentences are predicted in order of length with each batch's unused "
        "padding removed; padding never changes a result, only the time.",
        "",
        "Durations of the stages (seconds; cached searches, trainings and predictions load "
        "instantly):",
        "",
        markdown_table(seconds),
        "",
    ]


def _sizes_sentence(setup: dict) -> str:
    """The run's sizes, and why they are smaller than the issue's."""
    config, p = setup["config"], setup["protocol"]
    cap = config["ood_cap"]
    capped = f"each report OOD set is cut to {cap:,} sentences" if cap else "no OOD set is cut"
    search = p["id_search_n"]
    return (
        f"the greedy searches score candidates on {search:,} ID + {search:,} search-OOD "
        "sentences (at 128 + 128, in an earlier run, the CircAvg search raised its objective on "
        "its search sentences and lowered the AUROC on every report set: it fitted its sample; "
        "each search's time grows with the sentences, and a run makes three searches per repeat "
        "and the stability runs on two CPU cores); "
        f"{capped}; all {p['id_report_n']:,} ID test sentences are reported; MC Dropout runs "
        f"T = {config['mc_passes']} passes."
    )


def _sizes(report_n: Mapping[str, int]) -> str:
    counts = sorted(set(report_n.values()))
    if len(counts) == 1:
        return f"{counts[0]:,} sentences each"
    return ", ".join(f"{n} {c:,}" for n, c in report_n.items())


def _deep_sentence(setup: dict) -> str:
    """How Deep Ensembles (D) was made, in words."""
    m, deep = setup["members"], setup["deep_heads"]
    if setup["deep"] is None:
        return "not run."
    if setup["deep"] == "train-text":
        return (
            f"{m} runs of the model's own recipe (`train-text`, seeds "
            f"{setup['protocol']['seeds']['deep_ensemble']}; seed 0 is the shipped model): they "
            "share what the recipe freezes (the wheel's embedding and encoder layers 0-3, stored "
            "once) and differ in what it trains (layers 4-5, pooler and classifier: the "
            "classifier's initialisation, batch order and dropout follow the seed), trained "
            "tensors rounded to float16 as shipped. The paper's Deep Ensembles (D) is the same "
            'idea at its scale: one fine-tuned BERT backbone, "three separate classifiers with '
            'different random seeds on top of it"; here the trained top is two layers, pooler '
            "and classifier, and the shared part is the frozen pre-trained encoder."
        )
    length = f"{deep['steps']} step(s)" if deep["steps"] else f"{deep['epochs']} epochs"
    choice = (
        ", the epoch of lowest NLL on the ID search sentences kept" if deep["epochs"] > 1 else ""
    )
    return (
        f"the source model's encoder shared, {m} heads (the parameters the model family calls "
        "the head: BERT's pooler and classifier) each re-initialised from its seed (PyTorch's "
        "default initialisation of a linear layer) and trained on the encoder's final states of "
        f"{_n_train(deep)} Rotten Tomatoes training sentences: AdamW lr {deep['lr']}, weight "
        f"decay {deep['weight_decay']}, batch {deep['batch_size']}, {length}{choice}, "
        f"{deep['warmup']:.0%} warm-up then linear decay, dropout on (the paper's \"three "
        'separate classifiers with different random seeds" on one fine-tuned backbone).'
    )


def _finetune_sentence(ft: dict | None) -> str:
    if ft is None:
        return "none (zero-shot rows only)."
    length = f"{ft['steps']} step(s)" if ft["steps"] else f"{ft['epochs']} epoch(s)"
    return (
        f"every pruned model and every member separately, the layers `train-text` trains (the top "
        f"{ft['trained_layers']} encoder layers, the pooler and the classifier; the lower layers, "
        f"pruned too, stay frozen), {length} of {_n_train(ft)} Rotten Tomatoes training "
        f"sentences, AdamW lr {ft['lr']} (decoupled weight decay {ft['weight_decay']} on weight "
        f"matrices), batch {ft['batch_size']}, linear warm-up over {ft['warmup']:.0%} of the steps "
        f"then linear decay to zero, gradient clipping {ft['grad_clip']}, no label smoothing, "
        "dropout on (D.2); the same batch order for every member. Fine-tuned members are fused "
        "with their MLPs averaged (paper 4.2)."
    )


def _n_train(config: dict) -> str:
    return "all 6,030" if config["n_train"] is None else f"{config['n_train']:,}"


#: the paper's headline statements about Table 2, summarised first
HEADLINES = (
    "Hydra (Circ) raises OOD AUROC",
    "Hydra (Circ) beats Deep Ensembles (D) on AUROC",
    "Hydra (Circ) lowers NLL",
    "CircAvg beats Taylor on OOD AUROC",
    "Deep Ensembles (D) raise OOD AUROC",
    "MC Dropout raises OOD AUROC",
)


def _summary_section(tables: Mapping[str, pd.DataFrame]) -> list[str]:
    """The paper's headline statements against ours (pruned systems fine-tuned after pruning,
    as the paper's; zero-shot where no fine-tuned row exists), the verdict counts, and whether
    the search's gains reached the report split."""
    claims = tables["paper_claims"]
    rows = claims.set_index("claim")
    lines = []
    for claim in HEADLINES:
        r = rows.loc[claim]
        form = "fine_tuned" if r["fine_tuned_verdict"] != "–" else "zero_shot"
        ours = signed(r["metric"], r[form], r[f"{form}_lo"], r[f"{form}_hi"])
        lines.append(
            f"- {claim}: paper {r['paper_difference']:+.2f}, ours {ours} "
            f"({form.replace('_', '-')}): **{r[f'{form}_verdict']}**."
        )
    return [
        "## Summary: the paper's statements against this run",
        "",
        "Differences in points for accuracy and OOD metrics; ours with the paired 95% interval. "
        "The full list, zero-shot and fine-tuned, is in the section on agreements below.",
        "",
        *lines,
        *verdict_counts(claims),
        *_transfer_line(tables),
        "",
    ]


def _transfer_line(tables: Mapping[str, pd.DataFrame]) -> list[str]:
    """Whether what the CircAvg search gained on its own sentences reached the report split:
    its scores on the search split against the zero-shot circuit's paired differences to the
    single model on the report split."""
    circuit = tables["circuit"].iloc[0]
    differences = tables["differences_to_single"].set_index("system")
    if CIRCAVG not in differences.index:
        return []
    d = 100 * differences.loc[CIRCAVG].drop("kind").astype(float)  # in points
    above = [d[f"{m}_lo"] > 0 for m in ("accuracy", "all_auroc")]
    below = [d[f"{m}_hi"] < 0 for m in ("accuracy", "all_auroc")]
    verdict = (
        "transferred"
        if all(above)
        else "did not transfer"
        if all(below)
        else "transferred only in part"
    )
    return [
        f"- **The search's gains {verdict}**: on its own search sentences the CircAvg circuit "
        f"moved accuracy from {100 * circuit['dense_search_accuracy']:.2f} to "
        f"{100 * circuit['search_accuracy']:.2f} and AUROC against the search OOD set from "
        f"{100 * circuit['dense_search_auroc']:.2f} to {100 * circuit['search_auroc']:.2f}; on "
        f"the report split (zero-shot) it changed accuracy by "
        f"{signed('accuracy', d['accuracy'], d['accuracy_lo'], d['accuracy_hi'])} and OOD "
        f"AUROC by {signed('auroc', d['all_auroc'], d['all_auroc_lo'], d['all_auroc_hi'])} "
        "against the single model."
    ]


def _circuit_section(tables: Mapping[str, pd.DataFrame], setup: dict) -> list[str]:
    heads = tables["heads_per_layer"]
    return [
        "## The CircAvg circuit and the heads every pruned model keeps",
        "",
        markdown_table(tables["circuit"].drop(columns=["removed"])),
        "",
        "(scores on the search split; `circuit.csv` lists the removed heads in removal order.)",
        "",
        "Heads kept per layer (Taylor keeps the same number in every layer; CircAvg and the "
        "members keep what the search and the draws leave):",
        "",
        markdown_table(heads),
        "",
    ]


def _table2_section(tables: Mapping[str, pd.DataFrame], setup: dict) -> list[str]:
    main = tables["table2_systems"]
    per_set = tables["per_set"]
    return [
        "## Table 2 - every system",
        "",
        "`trained after pruning`: yes = the pruned model or members were fine-tuned after pruning "
        "(the paper's setting for its text rows, D.2), no = zero-shot. OOD columns average the "
        "report OOD sets.",
        "",
        markdown_table(main),
        "",
        "The paper's Table 2 and Table 17 (bert-base-uncased on SST-2; no intervals given; its "
        "OOD averages are over Yelp and Amazon polarity (near) and 20 Newsgroups, TREC, MNLI, "
        "RTE and WMT16 (far); LoRA Ensembles is not run here), for reference:",
        "",
        markdown_table(paper_frame(tables["paper_table2"])),
        "",
        "## Table 17 - near and far OOD",
        "",
        markdown_table(tables["table17_near_far"]),
        "",
        "## Tables 18-20 - every OOD set (AUROC, then FPR95)",
        "",
        markdown_table(_pivot(per_set, "auroc", list(main["system"]))),
        "",
        markdown_table(_pivot(per_set, "fpr95", list(main["system"]))),
        "",
        "## Differences to the single model",
        "",
        "Each system minus the single model on the same report sentences, with the paired 95% "
        "bootstrap interval of the difference; a difference is significant only where its "
        "interval excludes 0 (`differences_to_single.csv`; accuracy and AUROC in points).",
        "",
        markdown_table(tables["differences_to_single"].drop(columns="kind")),
        "",
    ]


def _pivot(per_set: pd.DataFrame, metric: str, rows: list[str]) -> pd.DataFrame:
    """One row per system of ``rows`` (in that order), one column per OOD set: ``metric`` with
    its interval in the cell."""
    cells = per_set.assign(
        cell=[
            _with_interval(metric, v, lo, hi)
            for v, lo, hi in zip(
                per_set[metric], per_set[f"{metric}_lo"], per_set[f"{metric}_hi"], strict=True
            )
        ]
    )
    shown = [r for r in rows if r in set(cells["system"])]
    order = list(dict.fromkeys(cells["set"]))
    pivot = cells.pivot(index="system", columns="set", values="cell").loc[shown, order]
    return pivot.rename_axis(columns=None).reset_index()


def _with_interval(metric: str, value: float, lo: float, hi: float) -> str:
    scale = 100 if metric in PERCENT else 1
    if value != value:
        return "–"
    return f"{scale * value:.2f} [{scale * lo:.2f}, {scale * hi:.2f}]"


def _claims_section(
    claims: pd.DataFrame, setup: dict, repeats: pd.DataFrame | None = None
) -> list[str]:
    """The paper's statements against our paired differences, and a count of the verdicts."""
    shown = pd.DataFrame(
        {
            "paper says": claims["claim"],
            "paper": [f"{v:+.2f}" for v in claims["paper_difference"]],
            "ours, zero-shot": [
                signed(r["metric"], r["zero_shot"], r["zero_shot_lo"], r["zero_shot_hi"])
                for _, r in claims.iterrows()
            ],
            "verdict (zero-shot)": claims["zero_shot_verdict"],
            "ours, fine-tuned": [
                signed(r["metric"], r["fine_tuned"], r["fine_tuned_lo"], r["fine_tuned_hi"])
                for _, r in claims.iterrows()
            ],
            "verdict (fine-tuned)": claims["fine_tuned_verdict"],
            "fine-tuned, near / far OOD": near_far_verdicts(claims, "fine_tuned"),
        }
    )
    return [
        "## Agreements and disagreements with the paper",
        "",
        "Each statement Table 2 makes about a pair of systems (its difference in the paper's "
        "numbers: accuracy and OOD metrics in points) against our paired difference with its 95% "
        "interval. *agrees*: same direction, interval excludes 0; *disagrees*: opposite "
        "direction, interval excludes 0; *n.s.*: our interval contains 0. Systems that are not "
        "pruned (Single, Deep Ensembles (D), MC Dropout) are the same in both columns; pruned "
        "ones are compared zero-shot and fine-tuned after pruning (the paper fine-tunes). The "
        "paper gives no intervals, so a small difference of its own may be noise too.",
        "",
        *_repeats_sentence(repeats),
        markdown_table(shown),
        "",
        *verdict_counts(claims),
        "",
    ]


def _fusion_cost_section(tables: Mapping[str, pd.DataFrame], setup: dict) -> list[str]:
    cost = tables["table7_cost"]
    config = setup["config"]
    return [
        "## Fused vs separately run members (Table 11)",
        "",
        f"Each fused model against its members run one by one (probabilities averaged), on "
        f"{config['fusion_check']} report sentences: `max |Δp|` is the largest difference of the "
        "two ensembles' probabilities, `changed predictions` the sentences whose predicted class "
        "differs. Float error for zero-shot members (they share their MLPs); for fine-tuned "
        "members the effect of averaging their top layers' MLPs.",
        "",
        markdown_table(tables["fusion_check"]),
        "",
        "## Cost (Table 7, Figure 3)",
        "",
        f"Parameters as stored (shared ones once: Deep Ensembles (D) stores one encoder and "
        f"{setup['members']} heads); multiply-adds and latency for a batch of "
        f"{config['latency_batch']} report sentences at their own length (latency: median of "
        f"{config['latency_repeats']} round-robin calls, ms, on {setup['device']}; bf16 only on "
        "CUDA). The paper reports Hydra near the single model's time in half precision on a GPU "
        "and Deep Ensembles at about three times; a small model on a CPU need not behave the "
        "same.",
        "",
        markdown_table(cost_columns(cost)),
        "",
        "Training runs (Deep Ensembles' members, and fine-tuning after pruning; `seed`: the "
        "training seed, batch order and dropout, and for Deep Ensembles also the classifier's "
        "initialisation; every member is fine-tuned with the same seed, so members differ by "
        "their heads alone):",
        "",
        markdown_table(tables["training"]),
        "",
    ]


#: what of the paper's text experiments this report covers: (item, status, why)
TEXT_COVERAGE = (
    (
        "Table 2 (text classification: every system, every metric)",
        "partly",
        "every row but LoRA Ensembles, on all-MiniLM-L6-v2 and Rotten Tomatoes instead of "
        "bert-base-uncased and SST-2 (no BERT-base weights or GLUE data are reachable offline)",
    ),
    ("Table 17 (near/far OOD averages)", "reproduced", "with other near and far OOD sets"),
    (
        "Tables 18-20 (every OOD set)",
        "partly",
        "IMDB and tweets (near), ABC news, 20 Newsgroups and speeches (far) instead of Yelp, "
        "Amazon, 20NG, TREC, MNLI, RTE, WMT16",
    ),
    ("LoRA Ensembles", "not", "no LoRA training in Hydra Lab"),
    (
        "D.2 fine-tuning after pruning",
        "partly",
        "AdamW, warm-up then linear decay, clipping, no label smoothing, as D.2; only the top "
        "two layers, pooler and classifier are trained (as the model was fine-tuned), for a "
        "fraction of the paper's steps",
    ),
    ("Figure 3 / Table 7 (cost)", "partly", "parameters, multiply-adds and CPU latency"),
    (
        "Seeds (mean/std over seeds)",
        "partly",
        "the run's repeats (search subsample, pruning seeds, fine-tuning seed): the verdicts "
        "carry their variance (`repeats.csv`: every repeat's rows)",
    ),
)


def _coverage_section(setup: dict) -> list[str]:
    frame = pd.DataFrame(TEXT_COVERAGE, columns=["paper", "status", "why"])
    return [
        "## What this report covers",
        "",
        markdown_table(frame),
        "",
    ]


def _repeats_sentence(repeats: pd.DataFrame | None) -> list[str]:
    """How many repeats the verdicts are taken over, and what that means for the intervals."""
    n = 1 if repeats is None else int(repeats["repeat"].nunique())
    if n == 1:
        return [
            "One run: the intervals carry the sentences' variance only, not the seeds'.",
            "",
        ]
    return [
        f"Over {n} repeats (each with its own search subsample and three searches, pruning seeds "
        "and fine-tuning seed; the report sentences stay): each difference is the mean of the "
        "repeats' paired differences, its interval over repeats and sentences, so a verdict "
        f"holds across the seeds or is not issued. {INTERVAL_METHOD} A statement over all OOD "
        "sets is judged on the near and the far sets apart too. Every repeat's rows are in "
        "`repeats.csv`.",
        "",
    ]
