"""The upstream's instruction-pack builder (InstCache): an instruction language model
(upstream/pack/lm.py), Algorithm 1's tree search under an NLL budget (search.py), sizing
and hit-rate prediction (plan.py), and answering the predicted instructions into a pack
(build.py). Commands: `meancache pack train-lm|plan|build` (build_commands.py)."""
