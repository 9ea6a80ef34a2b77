"""The Python tour of docs/python.md (the README's example is a part of it), runnable as it
stands: `python docs/example.py` (about 40 s on 2 CPU cores; tests/docs/test_docs.py runs it and
checks that every line of those two blocks is here). Sizes are small so that it is quick; the
defaults are larger."""

import hydra_core as hc

loaded = hc.load_model("default")  # LoadedModel: .model (timm ViT, eval mode), .preprocess
bench = hc.default_benchmark(n_search=64, n_report=200)  # disjoint search / report splits
inputs = hc.search_inputs(loaded.preprocess, bench)  # search split as tensors, OOD pooled
cache = hc.DiskCache()  # cache/ in the repository: searches resume, results are reused

# 1. Greedy Headmap circuit (paper Algorithm 1): remove 6 heads, objective (accuracy + AUROC) / 2.
search = hc.greedy_circuit(
    loaded.model, inputs.id_x, inputs.id_y, inputs.ood_x, objective="avg", budget=6, cache=cache
)
print("removed:", search.labels())  # e.g. ['L5H3', 'L0H10', ...]
print("S_avg after each removal:", [round(s, 4) for s in search.scores])

# 2. Three members by seed sampling from the ranking, fused into one Hydra model.
layout = hc.head_layout(loaded.model)  # layers, heads per layer, head dim
members = hc.seed_sampled_members(
    search.ranking(), layout, budget=6, pool=12, seeds=[0, 1, 2], ranking_name="CircAvg"
)  # each prunes 6 heads drawn (its own seed) from the 12 least useful: CircAvg seed 0, 1, 2
print(hc.member_overlap(members)["jaccard"].round(2))  # pairwise Jaccard overlap of the kept heads
hydra = hc.fuse_members([(loaded.model, member.keep) for member in members])
x = loaded.preprocess(bench.id_report.images[:8])
member_logits = hydra(x)  # (8, 3, 10): every member's logits from one forward
probs = hc.ensemble_probs(member_logits)  # (8, 10): the mean of the members' softmax

# 3. Evaluate single / members / unfused / fused on the report split (never used for selection).
report = hc.evaluate_systems(loaded, bench, members, cache=cache)
print(report.summary().round(4).to_string())  # one row per system: ID metrics, near/far OOD
print(report.table().round(4).to_string())  # every system x every set (ID, each OOD set, averages)
print(report.cost.round(3).to_string())  # params, multiply-adds, latency on this device

# 4. The same with baselines beside Hydra: a list of systems, every one on the same report items
# (paired intervals). MC Dropout at a post-hoc rate: the default ViT was trained without dropout.
systems = [hc.Single(), hc.Hydra(members), hc.TemperatureBaseline(), hc.MCDropoutBaseline(rate=0.1)]
report = hc.evaluate_systems(loaded, bench, systems, cache=cache)
print(report.differences("single").round(4).to_string())  # each minus single, paired 95% interval
