"""Block hashes: the identity of a cached prefix.

A full block of `block_size` tokens is named by the hash of its tokens chained with the hash of everything
before it, so equal hashes mean equal prefixes (the whole sequence up to the block's end), not merely equal
blocks. The chain starts from a root that holds whatever else changes the cache's contents; one engine has
one model, dtype and cache layout, so the root is a constant — unless the request names a `cache_salt`
(vLLM's per-tenant isolation): its root is then the salt's hash, and only requests with the same salt can
share its blocks (and its recurrent-state snapshots, which are keyed by the same hashes).

blake2b with a 128-bit digest: collision-resistant (a crafted prompt cannot alias another tenant's prefix,
as Python's 64-bit `hash()` could), and ~1 µs per block.
"""

from __future__ import annotations

import hashlib
from array import array

BlockHash = bytes

ROOT: BlockHash = hashlib.blake2b(b"blazr-prefix-v1", digest_size=16).digest()


def hash_root(salt: str | None) -> BlockHash:
    """The root of a request's chain: `ROOT`, or one of its own for a cache salt."""
    if salt is None:
        return ROOT
    return hashlib.blake2b(b"blazr-prefix-salt\0" + salt.encode(), digest_size=16).digest()


def chain(parent: BlockHash, token_ids: list[int]) -> BlockHash:
    """The hash of a block holding `token_ids` that follows the prefix hashed as `parent`."""
    return hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=16).digest()


def extend_hashes(
    hashes: list[BlockHash], token_ids: list[int], block_size: int, root: BlockHash = ROOT
) -> None:
    """Append the hashes of the full blocks in `token_ids`, the tokens that follow the len(hashes) blocks
    already hashed (a partial block at the end is left out); the chain starts at `root`."""
    parent = hashes[-1] if hashes else root
    for i in range(len(token_ids) // block_size):
        parent = chain(parent, token_ids[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
