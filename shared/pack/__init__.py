"""Instruction packs (InstCache): the one pack file format that the builder on the upstream
and the lookup on the device share (both key it by ``shared.query.normalise_query``)."""

from meancache.shared.pack.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    Pack,
    PackManifest,
    manifest_from_json,
    read_manifest,
    read_pack,
    write_pack,
)

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "Pack", "PackManifest", "manifest_from_json",
           "read_manifest", "read_pack", "write_pack"]
