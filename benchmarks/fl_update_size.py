"""Bytes a device sends per round: the federated layers of each model as float32 weights,
as 8-bit and 4-bit updates, and as 8-bit and 4-bit low-rank updates (each matrix's
rank-r factors: run config update-rank; shared/fl/compression.py), counted as the server
counts them (ArrayRecord.count_bytes: array data with its npy header, and the names);
then the defaults' encoder + verifier total per encoder against the 5 MB budget; then,
on one device's real update (MiniLM's and the shipped verifier's federated layers trained
on --trained-pairs QQP train pairs as the ClientApp trains them), the share of the
update's L2 norm that the rank-r factors leave out, before quantisation.

The encoders' shapes are those of the shipped models (MiniLM-L6 and MPNet-base, random
weights: the bytes depend on the shapes alone); the verifier is its MiniLM-L6
cross-encoder (shared/verifier/model.py), whose federated part is its top layers and its
head (run config verifier-top-layers; shared.fl.weights.verifier_names).

    python benchmarks/fl_update_size.py                    # ranks 16, 64, 128
    python benchmarks/fl_update_size.py --ranks 32 64
"""

import argparse

import numpy as np
import torch
from _common import base_parser, heading, make_table, print_command, print_table
from flwr.app import Array, ArrayRecord
from meancache.fl_server.app_declaration import default_run_config
from meancache.shared.fl.compression import encode_update
from meancache.shared.fl.low_rank import factored
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


def _wire(trained: dict[str, np.ndarray], sent: dict[str, np.ndarray], bits: int,
          rank: int = 0) -> int:
    """Bytes of the encoded update as the server counts them (bits 0: float32 weights)."""
    body = trained if bits == 0 else encode_update(trained, sent, bits, rank)
    return ArrayRecord({n: Array(v) for n, v in body.items()}).count_bytes()


def _left_out(sent: dict[str, np.ndarray], trained: dict[str, np.ndarray], rank: int
              ) -> float:
    """||update - its rank-r approximation|| / ||update|| over all the tensors (those sent
    whole lose nothing): from the singular values, as truncated SVD leaves out the rest."""
    lost = total = 0.0
    for name, weights in sent.items():
        update = trained[name].astype(np.float64) - weights
        total += float(np.square(update).sum())
        if factored(update.shape, rank):
            lost += float(np.square(np.linalg.svd(update, compute_uv=False)[rank:]).sum())
    return (lost / total) ** 0.5 if total else 0.0


def _real_updates(args: "argparse.Namespace", app: dict[str, object]
                  ) -> dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """(sent, trained) of MiniLM's and the shipped verifier's federated tensors after one
    device's local training with the app's defaults (top layers, epochs, batch size)."""
    from meancache.client.fl.client_app import for_encoder
    from meancache.client.fl.train import TrainConfig, train_locally
    from meancache.shared.encoder import packaged_minilm_dir
    from meancache.shared.fl.weights import federated_names, federated_state
    from meancache.shared.pairs import read_pairs
    from meancache.shared.verifier.federated import base_verifier, train_verifier
    from sentence_transformers import SentenceTransformer

    pairs = read_pairs(args.data_dir / "qqp" / "pairs.jsonl", split="train")
    pairs = [pairs[i] for i in np.random.default_rng(args.seed).permutation(len(pairs))
             [:args.trained_pairs]]
    epochs, batch = int(app["epochs"]), int(app["batch-size"])  # type: ignore[call-overload]
    encoder = SentenceTransformer(str(packaged_minilm_dir()), device="cpu")
    names = federated_names(encoder, int(app["top-layers"]))  # type: ignore[call-overload]
    before = {n: v.numpy() for n, v in federated_state(encoder, names).items()}
    train_locally(encoder, for_encoder(pairs), TrainConfig(
        epochs, batch, args.learning_rate, int(app["top-layers"]), args.seed))  # type: ignore[call-overload]
    verifier = base_verifier(None)
    judged = verifier_names(verifier, int(app["verifier-top-layers"]))  # type: ignore[call-overload]
    judged_before = {n: v.numpy() for n, v in federated_state(verifier, judged).items()}  # type: ignore[arg-type]
    train_verifier(verifier, pairs, judged, epochs, batch, args.learning_rate, args.seed)
    return {"encoder MiniLM-L6": (before, {n: v.numpy() for n, v in federated_state(
                encoder, names).items()}),
            "verifier (shipped)": (judged_before, {n: v.numpy() for n, v in federated_state(
                verifier, judged).items()})}  # type: ignore[arg-type]


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--top-layers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64, 128])
    app = default_run_config()
    parser.add_argument("--trained-pairs", type=int, default=100,
                        help="QQP pairs one device trains on for the share left out (0: skip)")
    parser.add_argument("--learning-rate", type=float, default=float(app["learning-rate"]))
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    defaults = {"encoder": int(app["top-layers"]), "verifier": int(app["verifier-top-layers"])}
    bits, rank = int(app["update-bits"]), int(app["update-rank"])
    table = make_table(["model", "top layers", "values", "float32 MB", "8-bit MB", "4-bit MB"])
    ranked = make_table(["model", "top layers", "rank", "values sent", "8-bit MB", "4-bit MB"])
    at_defaults: dict[str, int] = {}  # model -> bytes with the app's defaults
    for label, model in _encoders().items():
        for top in args.top_layers:
            sent = _with_head(model, top)
            trained = {n: v + rng.normal(scale=1e-3, size=v.shape).astype(np.float32)
                       for n, v in sent.items()}
            table.add_row(label, str(top), f"{sum(v.size for v in sent.values()):,}",
                          *(f"{_wire(trained, sent, b) / 1e6:.2f}" for b in (0, 8, 4)))
            for r in args.ranks:
                sizes = {b: _wire(trained, sent, b, r) for b in (8, 4)}
                values = sum(r * sum(v.shape) if factored(v.shape, r) else v.size
                             for v in sent.values())
                ranked.add_row(label, str(top), str(r), f"{values:,}",
                               *(f"{sizes[b] / 1e6:.2f}" for b in (8, 4)))
            side = "verifier" if label.startswith("verifier") else "encoder"
            if top == defaults[side]:
                at_defaults[label] = _wire(trained, sent, bits, rank)
    heading("Bytes a device sends per round, every value")
    print_table(table)
    heading("Bytes a device sends per round, each matrix's update as rank-r factors "
            "(vectors and thin matrices whole)")
    print_table(ranked)
    totals = make_table(["encoder", "encoder MB", "verifier MB", "together MB",
                         f"within {LIMIT / 1e6:.0f} MB"])
    verifier = next(v for k, v in at_defaults.items() if k.startswith("verifier"))
    for label, size in at_defaults.items():
        if not label.startswith("verifier"):
            totals.add_row(label, f"{size / 1e6:.2f}", f"{verifier / 1e6:.2f}",
                           f"{(size + verifier) / 1e6:.2f}",
                           "yes" if size + verifier <= LIMIT else "no")
    heading(f"The app's defaults: encoder top {defaults['encoder']} layers, verifier top "
            f"{defaults['verifier']} and head, {bits}-bit update, rank {rank} (budget: "
            f"{LIMIT / 1e6:.0f} MB for the encoder and the verifier together)")
    print_table(totals)
    if args.trained_pairs:
        kept = make_table(["model", *(f"rank {r}" for r in args.ranks)])
        for label, (before, after) in _real_updates(args, app).items():
            kept.add_row(label, *(f"{_left_out(before, after, r):.3f}" for r in args.ranks))
        heading(f"Share of one device's update (L2 norm) the rank-r factors leave out: "
                f"{args.trained_pairs} QQP train pairs, learning rate "
                f"{args.learning_rate:g}, the app's top layers and epochs")
        print_table(kept)
    print_command()


if __name__ == "__main__":
    main()
