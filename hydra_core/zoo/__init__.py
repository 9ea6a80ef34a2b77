"""Hydra Lab's shipped and named models: what a model source names and how it is loaded.

- :mod:`~hydra_core.zoo.registry`: :func:`~hydra_core.zoo.registry.load_model`, every model
  source (a named model, a timm name, a checkpoint file, a Hugging Face folder or name, an
  OpenCLIP source, a kind of file registered from above: a fused Hydra file) as a
  :class:`~hydra_core.zoo.loaded.LoadedModel` (:mod:`~hydra_core.zoo.loaded`);
- :mod:`~hydra_core.zoo.named`: one record per named model (name, label, description,
  modality, loader, options, training recipe), which the Setup page, the CLI, the sweeps and the
  baselines read; :mod:`~hydra_core.zoo.sources`: the kinds of source (prefixes, file kinds);
- one module per named model, its loader and the recipe that trains it (a configuration of
  :mod:`hydra_core.training`): :mod:`~hydra_core.zoo.default` (the Fashion-MNIST ViT),
  :mod:`~hydra_core.zoo.dinov2` (DINOv2 ViT-S/14 with a linear probe),
  :mod:`~hydra_core.zoo.minilm` (``minilm-sentiment``), :mod:`~hydra_core.zoo.mpnet`
  (``mpnet-sentiment``).

The seam every family implements is :mod:`hydra_core.models`; nothing here is needed to analyse
a model that comes from elsewhere.
"""
