"""The instruction language model: trained from scratch (a small GPT-2 with a BPE
tokenizer trained on the same instructions; minutes here) or fine-tuned from a base model
(``--base builtin:gemma-3-270m``, loaded offline like the server's model). Checkpoints
every few hundred steps; a killed run resumes from the last one.

An instruction is the sequence ``bos + tokens + eos``; the tree search emits a path when
it produces ``eos``, so the model learns where instructions end.
"""

import json
import logging
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from meancache.shared.errors import PackError
from meancache.shared.progress import Progress
from meancache.upstream.pack.data import read_instructions, split_instructions
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

log = logging.getLogger(__name__)

META_FILE = "instruction_lm.json"
CHECKPOINT_SUFFIX = ".checkpoint"  # beside the output directory, gone once it is saved
TRAIN_STATE = "train_state.pt"
SPECIALS = ("<|begin|>", "<|end|>", "<|pad|>")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 2
    batch_size: int = 32
    learning_rate: float | None = None  # None: 1e-3 from scratch, 5e-5 for a base model
    max_tokens: int = 48  # longer instructions are cut (the search's max depth is below)
    vocab_size: int = 4000  # from scratch only
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    seed: int = 0
    checkpoint_every: int = 200  # steps
    limit: int | None = None  # train on the first N of the train split (a base model on CPU)
    # Freeze the input embedding (tied to the output layer in Gemma: 170M of its 270M
    # parameters): no optimizer state or weight gradient for it, about half the step.
    freeze_embeddings: bool = False


@dataclass(frozen=True)
class InstructionLM:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    bos: int
    eos: int
    pad: int

    def encode(self, text: str, max_tokens: int) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
        return [self.bos, *ids, self.eos]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode([i for i in ids if i not in (self.bos, self.eos)])

    @property
    def deepest(self) -> int | None:
        """The deepest path the model has positions for (None: no limit it states): a
        path is its begin token, this many tokens and its end token (GPT-2's learned
        position table ends at ``n_positions``; a rotary model reaches much further)."""
        config = self.model.config
        positions = getattr(config, "n_positions", None) \
            or getattr(config, "max_position_embeddings", None)
        return None if positions is None else positions - 2

    def check_depth(self, max_depth: int) -> None:
        """Refuse, in one line, a search deeper than the model can represent."""
        if self.deepest is not None and max_depth > self.deepest:
            raise PackError(f"--max-depth {max_depth} is beyond this instruction LM: it has "
                            f"{self.deepest + 2} positions, so at most --max-depth "
                            f"{self.deepest} (train it with a larger --max-tokens for deeper "
                            "instructions)")


def wrap(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> InstructionLM:
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if bos is None or eos is None:
        raise PackError("the instruction LM's tokenizer needs a begin and an end token")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return InstructionLM(model, tokenizer, bos, eos, pad)


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the instructions themselves (no download)."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=SPECIALS[0],
                                   eos_token=SPECIALS[1], pad_token=SPECIALS[2])


def load_lm(directory: Path) -> InstructionLM:
    """A trained instruction LM (``train-lm``'s output directory, or its checkpoint)."""
    if not (directory / "config.json").is_file():
        raise PackError(f"{directory} holds no instruction LM; train one with "
                        "`meancache pack train-lm`")
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return wrap(model.eval(), tokenizer)


def _fresh(base: str | None, texts: list[str], config: TrainConfig,
           data_dir: Path | None) -> InstructionLM:
    if base is not None:
        from meancache.upstream.model_loading import load_model

        loaded = load_model(base, device="cpu", data_dir=data_dir)
        return wrap(loaded.model, loaded.tokenizer)
    tokenizer = train_tokenizer(texts, config.vocab_size)
    torch.manual_seed(config.seed)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=len(tokenizer), n_positions=config.max_tokens + 2, n_embd=config.hidden,
        n_layer=config.layers, n_head=config.heads, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    return wrap(model, tokenizer)


def _batch(lm: InstructionLM, texts: list[str], max_tokens: int) -> dict[str, torch.Tensor]:
    rows = [lm.encode(t, max_tokens) for t in texts]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), lm.pad)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _save(lm: InstructionLM, directory: Path, extra: dict[str, object] | None = None) -> None:
    """Save beside ``directory`` and swap it in: a kill mid-save keeps the last one."""
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    lm.model.save_pretrained(partial)
    lm.tokenizer.save_pretrained(partial)
    for name, value in (extra or {}).items():
        if name.endswith(".pt"):
            torch.save(value, partial / name)
        else:
            (partial / name).write_text(json.dumps(value, indent=1), encoding="utf-8")
    shutil.rmtree(directory, ignore_errors=True)
    partial.rename(directory)


def train_lm(data: Path, out: Path, base: str | None = None,
             config: TrainConfig = TrainConfig(), progress: Progress | None = None,
             data_dir: Path | None = None) -> Path:
    """Train on the split's train part and save to ``out``; returns ``out``."""
    split = split_instructions(read_instructions(data), config.seed)
    train = split.train[:config.limit]
    if not train:
        raise PackError(f"{data} leaves no instructions to train on (limit {config.limit})")
    checkpoint = out.with_name(out.name + CHECKPOINT_SUFFIX)
    step, seconds = 0, 0.0
    if (checkpoint / TRAIN_STATE).is_file():
        lm = load_lm(checkpoint)
        state = torch.load(checkpoint / TRAIN_STATE, weights_only=True)
        step, seconds = int(state["step"]), float(state.get("seconds", 0.0))
        log.info("resuming the instruction LM from step %d", step)
    else:
        lm = _fresh(base, train, config, data_dir)
        state = None
    if config.freeze_embeddings:
        lm.model.get_input_embeddings().weight.requires_grad_(False)
    trainable = [p for p in lm.model.parameters() if p.requires_grad]
    rate = config.learning_rate or (5e-5 if base else 1e-3)
    optimizer = torch.optim.AdamW(trainable, lr=rate)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    per_epoch = -(-len(train) // config.batch_size)
    total = per_epoch * config.epochs
    lm.model.train()
    torch.manual_seed(config.seed + step)
    start = time.monotonic() - seconds  # training time over resumes, for the record
    for done in range(step, total):
        epoch, index = divmod(done, per_epoch)
        order = train[:]
        random.Random(config.seed + epoch).shuffle(order)
        texts = order[index * config.batch_size:(index + 1) * config.batch_size]
        loss = lm.model(**_batch(lm, texts, config.max_tokens)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if progress is not None:
            progress(done + 1, total)
        if (done + 1) % config.checkpoint_every == 0 and done + 1 < total:
            _save(lm, checkpoint, {TRAIN_STATE: {
                "step": done + 1, "seconds": time.monotonic() - start,
                "optimizer": optimizer.state_dict()}})
    lm.model.eval()
    meta = {"base": base, "data": str(data), "config": asdict(config), "steps": total,
            "seconds": round(time.monotonic() - start, 3),
            "train": len(train), "validation": len(split.validation)}
    _save(lm, out, {META_FILE: meta})
    shutil.rmtree(checkpoint, ignore_errors=True)
    return out
