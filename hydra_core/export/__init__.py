"""Hydra Lab's results for other tools: fused and pruned models as ONNX, member masks for nnsight
and as plain JSON.

- :mod:`~hydra_core.export.onnx`: :func:`~hydra_core.export.onnx.export_onnx` (a fused Hydra
  model) and :func:`~hydra_core.export.onnx.export_pruned_onnx` (one structurally pruned
  model), checked under onnxruntime against torch;
- :mod:`~hydra_core.export.masks`: :func:`~hydra_core.export.masks.plain_masks`,
  :func:`~hydra_core.export.masks.nnsight_ablate` and
  :func:`~hydra_core.export.masks.nnsight_module`;
- :mod:`~hydra_core.export.nnsight_apply`: the code that switches heads off inside an nnsight
  trace, copied whole into the modules ``nnsight_module`` writes (it imports only torch).
"""
