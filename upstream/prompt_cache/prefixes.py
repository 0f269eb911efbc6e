"""Automatic prefix reuse: the attention states of a prompt's new tokens, kept in blocks of
:data:`BLOCK_TOKENS` tokens that a later prompt starting with the same tokens reads back
instead of computing (vLLM's automatic prefix caching; llama.cpp's ``cache_prompt``).

A block is named by a hash chain: its hash covers the hash of the block before it and its
own tokens and positions, and the first block's covers the *root*: the model, the PML
segments the prompt reuses (their tokens and positions: what the block's tokens attend
to) and nothing else. Equal hashes thus mean equal everything a block's states depend on,
so reading them back gives what computing them would give (up to float summation order).
Only whole blocks are kept, and a prompt always computes at least its last token, whose
logits start the answer.

Blocks live in the module store under their tenant's own namespace (a tenant's lookups
never reach another's blocks, whatever the hashes), sharing its budget and LRU order with
PML modules. A prompt's chain is touched deepest block first, so that eviction takes the
tail of a conversation before its start.
"""

import hashlib
from array import array
from collections.abc import Sequence

from meancache.upstream.prompt_cache.module_store import Key

BLOCK_TOKENS = 16  # vLLM's default: a prompt diverging mid-block recomputes at most 15 more


def namespace(tenant: str) -> str:
    """Where ``tenant``'s blocks are kept: '#' is in no schema name, so no schema's key
    (``name`` or ``tenant:name``) is ever a prefix namespace."""
    return f"#prefix:{tenant}"


def root(model: str, segments: Sequence[tuple[str, Sequence[int], Sequence[int]]]) -> bytes:
    """The chain's start for a prompt of ``model`` that reuses ``segments`` (name, token
    ids, positions), in the order the prompt reads them."""
    digest = hashlib.sha256(model.encode())
    for name, ids, positions in segments:
        digest.update(b"\0" + name.encode() + b"\0")
        digest.update(_packed(ids, positions))
    return digest.digest()


def chain(start: bytes, tenant: str, ids: Sequence[int], positions: Sequence[int],
          block: int = BLOCK_TOKENS) -> list[Key]:
    """The keys of the whole blocks of ``ids`` (at ``positions``, sorted), first to last."""
    keys: list[Key] = []
    digest = start
    for first in range(0, len(ids) - block + 1, block):
        digest = hashlib.sha256(digest + _packed(ids[first:first + block],
                                                 positions[first:first + block])).digest()
        keys.append((namespace(tenant), digest.hex()))
    return keys


def _packed(ids: Sequence[int], positions: Sequence[int]) -> bytes:
    return array("q", [len(ids), *ids, *positions]).tobytes()
