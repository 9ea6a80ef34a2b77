"""The texts behind a text model's numbers, for the pages to show: the sentences of the report
sample (hover labels of the representation scatter, see
:func:`~hydra_ui.figures.projection_scatter`) and the report sentences where a Hydra ensemble is
most uncertain."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from hydra_core.analysis.inputs import REPORT_SAMPLE
from hydra_core.data.benchmark import Benchmark
from hydra_core.data.images import take
from hydra_core.evaluate import Evaluation
from hydra_core.metrics.diversity import mutual_information

#: what Markdown (and Streamlit's $ for LaTeX, : for emoji and colours) reads as markup
_MARKUP = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")
#: the columns of :func:`most_uncertain` as :func:`readable` names them
READABLE = {"text": "sentence", "mutual_information": "MI (nats)", "label": "true class"}


def report_sample_texts(
    benchmark: Benchmark, n: int | None = REPORT_SAMPLE
) -> dict[str, tuple[str, ...]]:
    """The texts of :func:`~hydra_core.analysis.inputs.report_sample` (same ``n``), in its
    order: ``"ID"`` for the ID report part, then each report OOD set by name."""
    texts = {"ID": take(benchmark.id_report, n, purpose="describe").inputs}
    texts.update({s.name: take(s, n, purpose="describe").inputs for s in benchmark.ood_report})
    return texts


def with_texts(
    frame: pd.DataFrame, texts: dict[str, tuple[str, ...]], sets: Sequence[str]
) -> pd.DataFrame:
    """A projection of the report sample (rows: ID, then each of ``sets``, as
    :func:`~hydra_core.analysis.representations.project_features` orders them) with each row's
    text in a ``text`` column."""
    ordered = [t for name in ("ID", *sets) for t in texts[name]]
    if len(ordered) != len(frame):
        raise ValueError(
            f"the projection has {len(frame)} rows but ID and {', '.join(sets)} have "
            f"{len(ordered)} texts: it was made from another sample"
        )
    return frame.assign(text=ordered)


def most_uncertain(
    evaluation: Evaluation,
    benchmark: Benchmark,
    *,
    members: Sequence[str],
    classes: Sequence[str] | None = None,
    sets: Sequence[str] | None = None,
    top: int = 20,
) -> pd.DataFrame:
    """The ``top`` report texts on which an ensemble is most uncertain, by mutual information
    (the entropy of the mean member probabilities minus the members' mean entropy, nats: how
    much the members disagree).

    Args:
        evaluation: the ensemble's evaluation on ``benchmark``'s report parts, member logits
            (N, M, C) per set (a :class:`~hydra_core.experiment.results.SystemsReport` entry).
        benchmark: the text benchmark it was evaluated on (its report texts, in the same order).
        members: the members' names, one per member (column names).
        classes: class names, index = class (default: the indices).
        sets: only texts of these sets (``evaluation``'s set names; default: all).
        top: how many rows.

    Returns:
        One row per text, most uncertain first: text, set, group, mutual_information,
        prediction (the ensemble's: mean member probability), probability, label (ID only)
        and one column per member with its predicted class.
    """
    texts = {s.name: s.inputs for s in [benchmark.id_report, *benchmark.ood_report]}
    parts = [p for p in [evaluation.id, *evaluation.ood] if sets is None or p.name in sets]
    if not parts:
        raise ValueError(f"no report set named {', '.join(sets or ())} in {evaluation.name}")
    logits = torch.cat([p.logits for p in parts])  # (N, M, C)
    if logits.ndim != 3 or logits.shape[1] != len(members):
        raise ValueError(
            f"expected member logits (N, {len(members)}, C) of the {len(members)} members, got "
            f"{tuple(logits.shape)}"
        )
    member_probs = logits.double().softmax(-1).numpy()  # (N, M, C)
    mi = mutual_information(member_probs, reduction="none")  # (N,)
    probs = member_probs.mean(axis=1)  # (N, C): the ensemble's prediction
    names = np.asarray(classes if classes is not None else range(probs.shape[1]), dtype=object)
    shown, label = [], []
    for p in parts:
        if len(texts[p.name]) != len(p.logits):
            raise ValueError(
                f"{p.name}: {len(p.logits)} predictions but {len(texts[p.name])} report texts: "
                "the evaluation was made on another benchmark"
            )
        shown += texts[p.name]
        label += [""] * len(p.logits) if p.labels is None else list(names[p.labels.numpy()])
    frame = pd.DataFrame(
        {
            "text": shown,
            "set": [p.name for p in parts for _ in range(len(p.logits))],
            "group": [p.group for p in parts for _ in range(len(p.logits))],
            "mutual_information": mi,
            "prediction": names[probs.argmax(axis=1)],
            "probability": probs.max(axis=1),
            "label": label,
        }
    )
    votes = member_probs.argmax(axis=2)  # (N, M)
    for m, member in enumerate(members):
        frame[member] = names[votes[:, m]]
    order = np.argsort(-mi, kind="stable")[:top]
    return frame.iloc[order].reset_index(drop=True)


def markdown_literal(text: str) -> str:
    """``text`` for a Markdown cell (``st.table``), shown as it is: every character Markdown or
    Streamlit would read as markup escaped with a backslash."""
    return _MARKUP.sub(r"\\\1", text)


def readable(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`most_uncertain`'s table as ``st.table`` shows it: texts as literal Markdown (a
    static table wraps them, so they can be read whole), numbers with three decimals, columns
    named for readers."""
    shown = table.rename(columns=READABLE)
    shown["sentence"] = shown["sentence"].map(markdown_literal)
    for column in ("MI (nats)", "probability"):
        shown[column] = shown[column].map("{:.3f}".format)
    return shown
