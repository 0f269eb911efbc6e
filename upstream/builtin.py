"""Built-in, randomly initialised models: every mechanism runs without any download.

Their text is meaningless, but KV reuse, streaming and timing are real (timing does not
depend on weight values). The tokenizer is byte-level (one token per UTF-8 byte) with a
few special tokens for the chat template, so it needs no training data either.
"""

from dataclasses import dataclass

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

SPECIAL_TOKENS = ("<|begin|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|pad|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
    "{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)


@dataclass(frozen=True)
class BuiltinSpec:
    architecture: str  # "llama", "gpt2" or "gemma3"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int = 8192
    sliding_window: int | None = None  # gemma3: its sliding layers' window, in tokens


BUILTIN_MODELS: dict[str, BuiltinSpec] = {
    # For tests and the default demo: starts in well under a second.
    "tiny": BuiltinSpec("llama", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128),
    "tiny-gpt2": BuiltinSpec("gpt2", hidden=64, layers=2, heads=4, kv_heads=4, intermediate=256),
    # Gemma 3's mix of sliding and global layers, with a window short enough for tests to cross.
    "tiny-gemma3": BuiltinSpec("gemma3", hidden=64, layers=2, heads=4, kv_heads=2,
                               intermediate=128, sliding_window=12),
    # For benchmarks: ~113M parameters, Llama architecture.
    "base": BuiltinSpec("llama", hidden=768, layers=16, heads=12, kv_heads=12, intermediate=2048),
}


def _byte_chars() -> dict[str, int]:
    """GPT-2's reversible byte <-> printable-character table, as character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    codes = printable[:]
    shifted = 0
    for byte in range(256):
        if byte not in printable:  # control and space bytes get characters above U+00FF
            printable.append(byte)
            codes.append(256 + shifted)
            shifted += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


def builtin_tokenizer() -> PreTrainedTokenizerFast:
    vocab = _byte_chars()  # token id = byte value
    for offset, token in enumerate(SPECIAL_TOKENS):
        vocab[token] = 256 + offset
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|begin|>", eos_token="<|end|>",
        pad_token="<|pad|>", model_max_length=BUILTIN_MODELS["tiny"].max_positions,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def builtin_model(name: str, seed: int = 0) -> PreTrainedModel:
    """A randomly initialised model of the named built-in size (deterministic per seed)."""
    spec = BUILTIN_MODELS[name]
    tokenizer_ids = {"bos_token_id": 256, "eos_token_id": 257, "pad_token_id": 261}
    torch.manual_seed(seed)
    if spec.architecture == "gpt2":
        config = GPT2Config(
            vocab_size=VOCAB_SIZE, n_embd=spec.hidden, n_layer=spec.layers, n_head=spec.heads,
            n_inner=spec.intermediate, n_positions=spec.max_positions, **tokenizer_ids,
        )
        model: PreTrainedModel = GPT2LMHeadModel(config)
    elif spec.architecture == "gemma3":
        config = Gemma3TextConfig(
            vocab_size=VOCAB_SIZE, hidden_size=spec.hidden, num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
            head_dim=spec.hidden // spec.heads, query_pre_attn_scalar=spec.hidden // spec.heads,
            intermediate_size=spec.intermediate, max_position_embeddings=spec.max_positions,
            sliding_window=spec.sliding_window,
            layer_types=["sliding_attention", "full_attention"] * (spec.layers // 2),
            **tokenizer_ids,
        )
        model = Gemma3ForCausalLM(config)
    else:
        config = LlamaConfig(
            vocab_size=VOCAB_SIZE, hidden_size=spec.hidden, num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
            intermediate_size=spec.intermediate, max_position_embeddings=spec.max_positions,
            tie_word_embeddings=False, **tokenizer_ids,
        )
        model = LlamaForCausalLM(config)
    return model.eval()
