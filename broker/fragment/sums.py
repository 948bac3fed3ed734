"""SHA-1 digests as the protocol's SHA1Sum message: 20 bytes, big-endian across three parts."""

from __future__ import annotations

import hashlib

from broker.protocol import pb

DIGEST_SIZE = 20


def sha1sum_from_digest(d: bytes) -> pb.SHA1Sum:
    """Return the SHA1Sum of a 20-byte digest."""
    if len(d) != DIGEST_SIZE:
        raise ValueError(f"invalid SHA-1 digest length ({len(d)}; expected {DIGEST_SIZE})")
    return pb.SHA1Sum(
        part1=int.from_bytes(d[0:8], "big"),
        part2=int.from_bytes(d[8:16], "big"),
        part3=int.from_bytes(d[16:20], "big"),
    )


def digest_of(s: pb.SHA1Sum) -> bytes:
    """Return the 20-byte digest of a SHA1Sum."""
    return s.part1.to_bytes(8, "big") + s.part2.to_bytes(8, "big") + s.part3.to_bytes(4, "big")


def sha1sum_hex(s: pb.SHA1Sum) -> str:
    """Return the digest of a SHA1Sum as 40 lowercase hex digits."""
    return digest_of(s).hex()


def is_zero(s: pb.SHA1Sum) -> bool:
    """Whether a SHA1Sum is all zero, the sum that empty fragments carry."""
    return s.part1 == 0 and s.part2 == 0 and s.part3 == 0


ZERO_SUM = pb.SHA1Sum()
"""The all-zero sum of an empty fragment (not the SHA-1 of b"")."""

EMPTY_SHA1 = sha1sum_from_digest(hashlib.sha1(b"").digest())
"""SHA-1 of b"" (da39a3ee...), the commit sum of a zero-byte append."""
