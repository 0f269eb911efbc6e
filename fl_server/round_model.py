"""What a Flower round's message says about the global model it carries: its round (in
the server's numbering, continued across runs), the threshold, the pooled error-bound
evidence (shared.fl.bound_evidence), the weights' sha256 and,
where the verifier is federated, the int8 verifier its tensors apply over
(``verifier_base``), signed by the server's key at the moment it is sent. A device keeps
the model only if the signature verifies under the key it trusts and the description is
fresh (shared.fl.freshness: the same rule as `fl sync`), so a replayed round or a stale
SuperLink cannot roll it back."""

import json
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ArrayRecord
from meancache.shared.encoder.fingerprint import space_version
from meancache.shared.encoder.global_weights import weights_version
from meancache.shared.fl.bound_evidence import BoundEvidence, cosine_judge
from meancache.shared.fl.checkpoint import GlobalModel, state_sha256, verifier_only
from meancache.shared.fl.signing import sign
from meancache.shared.verifier.decision import judge_for


@dataclass(frozen=True)
class RoundModels:
    key: Ed25519PrivateKey
    base_model: str  # fingerprint of the base encoder
    top_layers: int
    round_offset: int  # rounds of earlier runs this one continues from
    verifier_base: str = ""  # sha256 of the int8 verifier federated beside ("": none)
    # sha256 of the int8 verifier devices run where none came from a global model (the
    # shipped one, or the run's verifier-model): the judge of the error-bound labels
    shipped_judge: str = ""

    def judge(self, server_round: int, arrays: ArrayRecord) -> str:
        """Whose scores the error-bound labels sent in reply to ``arrays`` (the global
        model after this run's ``server_round``) must be: the verifier devices run with
        it. Federated, a published model's verifier is named as a device names the one
        it makes from it (client.verifier: the model's sha256); the model a run starts
        from without a published one, or an unfederated verifier, is the int8 base.
        Either way the labels are the learned decision's score where its card was fitted
        on that base and the base encoder (shared.verifier.decision.judge_for: the
        default decision's, as a device names it; a device that chose the rules sends
        none)."""
        if self.verifier_base and server_round + self.round_offset > 0:
            return judge_for(state_sha256(arrays.to_torch_state_dict()), self.base_model,
                             self.verifier_base)
        base = self.verifier_base or self.shipped_judge
        return judge_for(base, self.base_model) if base else base

    def cosine_judge(self, server_round: int, arrays: ArrayRecord) -> str:
        """Whose scores the cosine's labels sent in reply to ``arrays`` must be: the
        embedding's cosine in the full space of the encoder devices run with it, named as
        a device names it (client.encoder: the base model's fingerprint with the published
        model's sha256 over it, shared.encoder.global_weights); the model a run starts
        from without a published one is the base model alone, as for ``judge``, and so is
        a model that holds no encoder tensor (run config train-encoder = 0): there the
        cosine stays one judge from round to round."""
        version = self.base_model
        if server_round + self.round_offset > 0 and not verifier_only(arrays):
            version = weights_version(self.base_model,
                                      state_sha256(arrays.to_torch_state_dict()))
        return cosine_judge(space_version(version, None))

    def describe(self, server_round: int, threshold: float, arrays: ArrayRecord,
                 bound: BoundEvidence | None = None,
                 cosine_bound: BoundEvidence | None = None) -> str:
        """The signed description (JSON) of ``arrays``, the global model after this run's
        ``server_round`` (0: the one it started from), with the pooled ``bound`` evidence
        (the verifier's labels) and ``cosine_bound`` (the cosine's)."""
        state = arrays.to_torch_state_dict()
        meta = GlobalModel(server_round + self.round_offset, float(threshold),
                           state_sha256(state), self.base_model, self.top_layers,
                           verifier_base=self.verifier_base,
                           bound=(bound or BoundEvidence.empty()).to_record(),
                           cosine_bound=(cosine_bound or BoundEvidence.empty()).to_record())
        return json.dumps(sign(meta, self.key).to_json())
