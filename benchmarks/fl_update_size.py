"""Bytes a device sends per round: the federated layers of each model as float32 weights
and as 8-bit and 4-bit updates (shared/fl/compression.py), counted as the server counts
them (ArrayRecord.count_bytes: array data with its npy header, and the names).

The encoders' shapes are those of the shipped models (MiniLM-L6 and MPNet-base, random
weights: the bytes depend on the shapes alone); the verifier is its MiniLM-L6
cross-encoder (shared/verifier/model.py), whose federated part is its top layers and its
head (run config verifier-top-layers; shared.fl.weights.verifier_names).

    python benchmarks/fl_update_size.py
"""

import numpy as np
import torch
from _common import base_parser, heading, make_table, print_command, print_table
from flwr.app import Array, ArrayRecord
from meancache.shared.fl.compression import encode_update
from meancache.shared.fl.weights import verifier_names
from transformers import AutoConfig, AutoModel, BertConfig, BertModel

LIMIT = 5 * 10**6  # the budget per device per round, encoder and verifier together


def _encoders() -> dict[str, torch.nn.Module]:
    from meancache.shared.encoder import packaged_minilm_dir

    minilm = AutoConfig.from_pretrained(str(packaged_minilm_dir()), local_files_only=True)
    mpnet = BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                       intermediate_size=3072, vocab_size=30527)  # MPNet-base's shapes
    verifier = torch.nn.Sequential()
    verifier.add_module("backbone", BertModel(minilm, add_pooling_layer=False))
    verifier.add_module("head", torch.nn.Linear(minilm.hidden_size, 1))
    return {"encoder MiniLM-L6": _as_sentence_transformer(AutoModel.from_config(minilm)),
            "encoder MPNet-base": _as_sentence_transformer(BertModel(mpnet)),
            "verifier (MiniLM-L6 cross-encoder)": verifier}


def _as_sentence_transformer(backbone: torch.nn.Module) -> torch.nn.Module:
    """Named as in a SentenceTransformer (``0.auto_model.encoder.layer.N...``)."""
    wrapper = torch.nn.Sequential()
    wrapper.add_module("auto_model", backbone)
    return torch.nn.Sequential(wrapper)


def _with_head(model: torch.nn.Module, top_layers: int) -> dict[str, np.ndarray]:
    """The federated tensors: an encoder's top layers, or the verifier's and its head."""
    names = set(verifier_names(model, top_layers))
    return {n: p.detach().numpy() for n, p in model.named_parameters() if n in names}


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--top-layers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    table = make_table(["model", "top layers", "values", "float32 MB", "8-bit MB", "4-bit MB"])
    for label, model in _encoders().items():
        for top in args.top_layers:
            sent = _with_head(model, top)
            trained = {n: v + rng.normal(scale=1e-3, size=v.shape).astype(np.float32)
                       for n, v in sent.items()}
            sizes = [ArrayRecord({n: Array(v) for n, v in trained.items()}).count_bytes()]
            for bits in (8, 4):
                encoded = encode_update(trained, sent, bits)
                sizes.append(ArrayRecord({n: Array(v) for n, v in encoded.items()})
                             .count_bytes())
            table.add_row(label, str(top), f"{sum(v.size for v in sent.values()):,}",
                          *(f"{b / 1e6:.2f}" for b in sizes))
    heading(f"Bytes a device sends per round (budget: {LIMIT / 1e6:.0f} MB for the encoder "
            "and the verifier together)")
    print_table(table)
    print_command()


if __name__ == "__main__":
    main()
