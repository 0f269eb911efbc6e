"""Write a tiny random-init Gemma 3 GGUF (float32, about 670 KB) that llama.cpp loads.

Why: exactness tests of a llama.cpp backend (cached against full prefill) need a model in
CI without the 240 MB Gemma 3 270M; llama.cpp needs a vocabulary, so this one has 256 byte
tokens and a few specials (callers feed token ids, never text). Checked with
llama-cpp-py-sync 0.11739: it loads, and a kept prefix plus the rest gives the full
prefill's logits bit for bit (docs/upstream.md, "Decoding speed: the choice").

    python scripts/tiny_gemma3_gguf.py OUT.gguf [SEED]
"""

import sys

import gguf
import numpy as np

WIDTH, LAYERS, FFN, HEADS, KV_HEADS, HEAD_DIM, WINDOW = 64, 4, 128, 2, 1, 32, 16
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
TOKENS = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "a", "b"]
# llama.cpp token types: 3 control, 2 unknown, 6 byte, 1 normal
TYPES = [3, 3, 3, 2] + [6] * 256 + [1] * 3


def write(path: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_context_length(256)
    w.add_embedding_length(WIDTH)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_sliding_window(WINDOW)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(TOKENS)
    w.add_token_scores([0.0] * len(TOKENS))
    w.add_token_types(TYPES)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    def tensor(name: str, *shape: int) -> None:  # numpy order: (rows, columns)
        w.add_tensor(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))

    tensor("token_embd.weight", len(TOKENS), WIDTH)
    tensor("output_norm.weight", WIDTH)
    for i in range(LAYERS):
        p = f"blk.{i}."
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            tensor(p + norm + ".weight", WIDTH)
        tensor(p + "attn_q.weight", HEADS * HEAD_DIM, WIDTH)
        tensor(p + "attn_k.weight", KV_HEADS * HEAD_DIM, WIDTH)
        tensor(p + "attn_v.weight", KV_HEADS * HEAD_DIM, WIDTH)
        tensor(p + "attn_q_norm.weight", HEAD_DIM)
        tensor(p + "attn_k_norm.weight", HEAD_DIM)
        tensor(p + "attn_output.weight", WIDTH, HEADS * HEAD_DIM)
        tensor(p + "ffn_gate.weight", FFN, WIDTH)
        tensor(p + "ffn_up.weight", FFN, WIDTH)
        tensor(p + "ffn_down.weight", WIDTH, FFN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    write(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
