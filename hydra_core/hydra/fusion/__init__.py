"""Hydra fusion (paper Section 4.2): M head-pruned members run as one model, in one pass.

The members' token streams are stacked along a leading member axis, ``(S, B, N, d)``. Each fused
block applies, per member, a grouped fully-connected Q/K/V projection (member m meets only its own
stream and its own kept heads), runs the attention of all members' heads in one
``scaled_dot_product_attention`` call, projects back to each member's stream with a grouped output
projection, and applies one MLP - the members' MLPs averaged - to every stream at once; norms are
per member.

Members may keep different numbers of heads per layer. A layer's per-member weights are padded with
zero rows/columns to the largest head count of that layer: a padded head has q = k = v = 0, so its
attention output is exactly 0, and its W_O columns are 0, so it adds exactly nothing.

Anything identical across members is stored once (``S = 1`` on the leading axis of its weights)
instead of per member (``S = M``). While the stem and the leading blocks are shared, the stream
keeps ``S = 1`` and is computed once; the first per-member weight broadcasts it to M streams.

Fusion never asks which family a member is from: the family reads each member into the canonical
parts of :mod:`hydra_core.models.parts` (``family.fusion_parts(model)``), and the parts' ``kind``
picks the fused model. The modules:

- :mod:`~hydra_core.hydra.fusion.fuse`: :func:`~hydra_core.hydra.fusion.fuse.fuse_members` and
  :func:`~hydra_core.hydra.fusion.fuse.check_fusable`, for every family;
- :mod:`~hydra_core.hydra.fusion.tensors`: the members' parts -> the fused model's named tensors
  (padded heads, the merged MLP, stacked norms);
- :mod:`~hydra_core.hydra.fusion.config`: what members must agree on, and the description a
  saved file's header holds;
- :mod:`~hydra_core.hydra.fusion.pre_norm`: :class:`~hydra_core.hydra.fusion.pre_norm.HydraViT`
  (pre-norm blocks on a patch stem: timm ViTs, OpenCLIP image towers);
- :mod:`~hydra_core.hydra.fusion.post_norm`:
  :class:`~hydra_core.hydra.fusion.post_norm.HydraText` (post-norm blocks on token embeddings:
  BERT, RoBERTa, MPNet, DistilBERT);
- :mod:`~hydra_core.hydra.fusion.zero_shot`:
  :class:`~hydra_core.hydra.fusion.zero_shot.HydraZeroShot` (a fused image tower with a shared
  zero-shot head);
- :mod:`~hydra_core.hydra.fusion.io`: ``save_hydra`` / ``load_hydra``, safetensors with the
  description as JSON in the header. Fusing and loading build the model through the same
  ``assemble_*`` function, so a loaded model is the same module as the saved one.

The building blocks (grouped linear layers, stacked LayerNorms, the merged MLP, the fused block,
the stem) are in :mod:`hydra_core.hydra.layers`. The fused models are for inference: the members'
dropout, drop-path and patch dropout are not kept. :mod:`hydra_core.hydra.fused` gathers the public
names.
"""
