"""Hydra Lab's engine: find the attention heads that carry a transformer's uncertainty, and fuse
head-pruned members into one Hydra ensemble. No Streamlit here; the app is a thin layer on top.

The names below are the public API (``hydra_core.greedy_circuit`` and so on). They are imported on
first use, so that ``import hydra_core.cli`` (and ``python -m hydra_core --help``) does not pay for
torch, timm and scikit-learn before it needs them."""

from __future__ import annotations

from hydra_core.lazy import lazy_exports

_EXPORTS = {
    "hydra_core.analysis.greedy": ("GreedyResult", "greedy_circuit", "single_head_importance"),
    "hydra_core.analysis.inputs": ("SearchInputs", "search_inputs"),
    "hydra_core.analysis.representations": (
        "centroid_distances",
        "distance_table_dense_vs_circuit",
        "head_cls_features",
    ),
    "hydra_core.analysis.taylor": ("taylor_prune", "taylor_scores"),
    "hydra_core.analysis.importance": ("importance_maps",),
    "hydra_core.analysis.evidence": ("HeadEvidence", "head_evidence", "read_stability"),
    "hydra_core.analysis.stability": ("StabilityResult", "greedy_stability"),
    "hydra_core.analysis.holdout": ("HeldOutCurve", "held_out_curve", "holdout_split"),
    "hydra_core.analysis.cahp": ("cahp_select",),
    "hydra_core.cache": ("DiskCache",),
    "hydra_core.data.benchmark": ("Benchmark", "default_benchmark"),
    "hydra_core.evaluate": ("evaluate_model",),
    "hydra_core.data.provenance": ("ChosenOn",),
    "hydra_core.export.masks": ("nnsight_ablate", "nnsight_module", "plain_masks"),
    "hydra_core.export.onnx": ("export_onnx", "export_pruned_onnx"),
    "hydra_core.analysis.compare": ("spearman", "spearman_matrix"),
    "hydra_core.hydra.members": (
        "cahp_members",
        "check_members",
        "circuit_member",
        "circuit_members",
        "greedy_ranking",
        "identical_members",
        "manual_members",
        "member_overlap",
        "seed_sampled_members",
        "taylor_member",
        "taylor_ranking",
    ),
    "hydra_core.hydra.finetune": ("FinetuneConfig", "finetune_members"),
    "hydra_core.experiment.systems": ("System",),
    "hydra_core.experiment.evaluate": ("evaluate_systems", "hydra_systems"),
    "hydra_core.experiment.results": ("SystemsReport",),
    "hydra_core.hydra.systems": ("FinetunedPruned", "Hydra", "Pruned", "Single"),
    "hydra_core.baselines.deep_ensembles": ("DeepEnsemble",),
    "hydra_core.baselines.systems": (
        "MCDropoutBaseline",
        "SharedBackboneBaseline",
        "TemperatureBaseline",
    ),
    "hydra_core.hydra.cost": ("cost_table", "measure_latency"),
    "hydra_core.report": ("ReportConfig", "run_report"),
    "hydra_core.hydra.fused": (
        "HydraConfig",
        "HydraViT",
        "ensemble_probs",
        "fuse_members",
        "load_hydra",
        "save_hydra",
    ),
    "hydra_core.hydra.fused_text": ("HydraText",),
    "hydra_core.hydra.fused_clip": ("HydraZeroShot",),
    "hydra_core.models.zero_shot": ("ZeroShotClassifier", "zero_shot_classifier"),
    "hydra_core.masks": (
        "MemberMask",
        "load_masks",
        "mask_from_ranking",
        "save_masks",
        "seed_sampled_masks",
    ),
    "hydra_core.models.adapter": ("ablate", "head_label", "head_layout", "prune_heads"),
    "hydra_core.zoo.default": ("load_default_model",),
    "hydra_core.zoo.registry": ("LoadedModel",),
    # load_model through the module that registers fused Hydra files as a model source
    "hydra_core.hydra.source": ("load_model",),
}
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
