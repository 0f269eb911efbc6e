"""Instruction packs (InstCache): the one query normalisation and the one pack file
format that the builder on the upstream and the lookup on the device share."""

from meancache.shared.pack.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    Pack,
    PackManifest,
    read_manifest,
    read_pack,
    write_pack,
)
from meancache.shared.pack.normalise import normalise_instruction

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "Pack", "PackManifest", "normalise_instruction",
           "read_manifest", "read_pack", "write_pack"]
