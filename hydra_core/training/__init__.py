"""Training: one loop, and the pieces recipes plug into it.

- :mod:`~hydra_core.training.trainer`: :func:`~hydra_core.training.trainer.train`, the one
  training loop (optimiser over a decay/no-decay split, per-step schedule, cross-entropy with
  optional label smoothing, clipping, epoch-end validation keeping the best epoch, seeds for
  batch order and dropout);
- :mod:`~hydra_core.training.schedules`: linear warm-up, then cosine or linear decay;
- :mod:`~hydra_core.training.prefix`: a frozen prefix run once, training only the top;
- :mod:`~hydra_core.training.top`: a text model's top (and Deep Ensembles' fresh heads) trained
  on states cached below it.

The recipes are configurations of the one loop: the default ViT
(:func:`hydra_core.zoo.default.train_vit`), ``train-text``
(:func:`hydra_core.zoo.minilm.train_minilm`, :func:`hydra_core.zoo.mpnet.train_mpnet_head`),
fine-tuning after pruning (:func:`hydra_core.hydra.finetune.finetune_member`) and
:func:`~hydra_core.training.top.finetune_top`.
"""
