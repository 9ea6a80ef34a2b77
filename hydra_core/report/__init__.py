"""The replication report: the paper's analyses re-run on our default model, whatever comes out.

``python -m hydra_core report`` writes ``report.md``, ``report.json`` and one CSV per table into an
output folder (default ``results/report``; the committed one is ``docs/report``). Sections, in
the paper's numbering:

- Table 4: zero-shot pruning, Taylor against the CircAvg circuit (same number of heads removed);
- Table 5: ID/OOD centroid distances of the last layer's heads, CircOOD against the dense model;
- Table 6: CircAcc against CircOOD;
- Tables 1-2: single model, Taylor, CircAvg, Hydra (Taylor), Hydra (Circ), Deep Ensembles (when
  trained copies exist) and the efficient ensembles whose trained copies are stored (never
  trained by the report) on every metric, zero-shot and, unless disabled, fine-tuned;
- Table 9: where diversity comes from: members differing by their pruning seed against identical
  members (and, fine-tuned, by batch order);
- Table 11: fused against non-fused members;
- Table 7: parameters, multiply-adds and latency.

Every head selection uses the search split; every number in the tables comes from the report
split. Searches and fine-tuned weights are cached, so a second run is much faster.

Each report is a declaration over the experiment pipeline (:mod:`hydra_core.experiment`): its
configuration, its systems, its claims and its tables, written by the one Markdown writer
(:mod:`~hydra_core.report.markdown`). The image report: :mod:`~hydra_core.report.run` (with
``image_*.py``); the text report: :mod:`~hydra_core.report.text` (with ``text_*.py``); the
zero-shot report: :mod:`~hydra_core.report.zero_shot`; the sweeps:
:mod:`~hydra_core.report.sweeps`.
"""

from hydra_core.experiment.pruning import Budgets
from hydra_core.report.image_config import DEFAULT_OUT, ReportConfig, config_from_args
from hydra_core.report.image_markdown import markdown_report
from hydra_core.report.markdown import markdown_table
from hydra_core.report.run import run_report
from hydra_core.report.tables import report_tables

__all__ = [
    "DEFAULT_OUT",
    "Budgets",
    "ReportConfig",
    "config_from_args",
    "markdown_report",
    "markdown_table",
    "report_tables",
    "run_report",
]
