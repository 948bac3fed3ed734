"""Authorization as Gazette's: JWT bearer tokens whose claims grant capabilities over the journals
(or shards) a label selector matches, signed and verified with pre-shared keys.

- `Capability`: LIST, APPLY, READ, APPEND, REPLICATE (bits 1..5; ALL is every bit; bits from
  1<<16 up are left to applications).
- `Claims`: a capability bit mask and a selector (`{"cap": ..., "sel": ..., "iat": ..., "exp": ...}`
  on the wire, the selector in Go's JSON). `authorizes(label_set)` matches the selector, with
  `prefix=` rewritten to `name:prefix=` as List does, against a journal's labels plus `name` (a
  shard's plus `id`).
- `KeyedAuth(keys)`: base64 keys separated by whitespace or commas (`--broker.auth-keys`). The
  first signs (HS256); any verifies (HS256 or HS384); `exp` is required, `iat` checked, 5 s of
  leeway. The key `AA==` lets a request without an Authorization header through with the
  capability it needs (for rolling auth out over a running cluster).
- `verify_call(auth, context, require)`: what every RPC handler calls first; aborts the call with
  UNAUTHENTICATED naming what is wrong, and returns the verified claims (None without keys: no
  authorization configured, everything allowed).
- `Signer`: the `authorization` metadata value a client sends, a static token (`--*.auth-token`)
  or one self-signed with keys and renewed before it expires.
"""

from __future__ import annotations

import base64
import binascii
import enum
import functools
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from google.protobuf import json_format

from broker.errors import AuthError
from broker.protocol import labels, pb

ALLOW_MISSING_KEY = "AA=="
"""The special key that lets requests without an Authorization header through."""
LEEWAY_SECONDS = 5
VERIFY_ALGORITHMS = ["HS256", "HS384"]
TOKEN_TTL = 3600.0
"""Seconds a self-signed client token is valid (Gazette's client signs blocking RPCs for 1 h)."""
RENEW_BEFORE = 300.0
"""Seconds before its expiry a self-signed token is replaced."""
VERIFIED_CACHE_SIZE = 4096
"""Verified tokens remembered (until they expire), so a stream of appends decodes its token once."""


class Capability(enum.IntFlag):
    """Gazette's capability bits (`pb.Capability`)."""

    NONE = 0
    LIST = 1 << 1
    APPLY = 1 << 2
    READ = 1 << 3
    APPEND = 1 << 4
    REPLICATE = 1 << 5
    ALL = 0xFFFFFFFF


_NAMED = (Capability.LIST, Capability.APPLY, Capability.READ, Capability.APPEND, Capability.REPLICATE)


def parse_capabilities(text: str) -> Capability:
    """Parse `READ,APPEND` (names, case-insensitive, or `ALL`) or a number into a Capability."""
    out = Capability.NONE
    for part in text.replace(",", " ").split():
        if part.isdigit() or part.lower().startswith("0x"):
            try:
                value = int(part, 0)
            except ValueError:
                raise AuthError(f"invalid capability {part!r}: expected a name or a number") from None
            if not 0 <= value <= Capability.ALL:
                raise AuthError(f"invalid capability {part!r}: it must fit in 32 bits")
            out |= Capability(value)
            continue
        try:
            out |= Capability[part.upper()]
        except KeyError:
            names = ", ".join(c.name or "" for c in (*_NAMED, Capability.ALL))
            raise AuthError(f"unknown capability {part!r} (expected one of {names}, or a number)") from None
    return out


def capability_names(cap: int) -> str:
    """`READ|APPEND`, `ALL`, or the number for bits without a name."""
    if cap == Capability.ALL:
        return "ALL"
    names = [c.name or "" for c in _NAMED if cap & c]
    rest = cap & ~sum(_NAMED)
    if rest:
        names.append(hex(rest))
    return "|".join(names) or "NONE"


@dataclass(frozen=True)
class Claims:
    """What a token grants: `capability` over what `selector` matches, until `expires_at`."""

    capability: int
    selector: pb.LabelSelector = field(default_factory=pb.LabelSelector)
    issued_at: int = 0
    expires_at: int = 0
    _rewritten: pb.LabelSelector = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rewritten", labels.rewrite_prefix_meta_label(self.selector))

    @property
    def matches_all(self) -> bool:
        return not self.selector.include.labels and not self.selector.exclude.labels

    def authorizes(self, label_set: pb.LabelSet) -> bool:
        """Whether the selector matches `label_set` (a journal's labels plus `name`, a shard's plus `id`)."""
        return self.matches_all or labels.matches(self._rewritten, label_set)

    def payload(self) -> dict[str, Any]:
        """The JWT claims, as Gazette's `pb.Claims` marshals them."""
        out: dict[str, Any] = {"cap": int(self.capability), "sel": selector_json(self.selector)}
        if self.issued_at:
            out["iat"] = self.issued_at
        if self.expires_at:
            out["exp"] = self.expires_at
        return out

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Claims:
        cap = payload.get("cap", 0)
        if not isinstance(cap, int) or isinstance(cap, bool) or not 0 <= cap <= Capability.ALL:
            raise AuthError(f"verifying Authorization: claim 'cap' must be a 32-bit unsigned integer (got {cap!r})")
        sel = payload.get("sel") or {}
        selector = pb.LabelSelector()
        try:
            json_format.ParseDict(sel, selector, ignore_unknown_fields=True)
        except (json_format.ParseError, TypeError, AttributeError) as exc:
            raise AuthError(f"verifying Authorization: claim 'sel' is not a label selector: {exc}") from None
        return cls(cap, selector, int(payload.get("iat") or 0), int(payload.get("exp") or 0))


def selector_json(selector: pb.LabelSelector) -> dict[str, Any]:
    """A LabelSelector as Go's encoding/json writes Gazette's (the `sel` claim)."""
    def label_set(ls: pb.LabelSet) -> dict[str, Any]:
        items = []
        for label in ls.labels:
            item: dict[str, Any] = {"name": label.name}
            if label.value:
                item["value"] = label.value
            if label.prefix:
                item["prefix"] = True
            items.append(item)
        return {"labels": items} if items else {}

    return {"include": label_set(selector.include), "exclude": label_set(selector.exclude)}


def parse_keys(text: str) -> tuple[list[bytes], bool]:
    """Keys of `--broker.auth-keys` (base64, separated by whitespace or commas) and whether `AA==` is among them."""
    keys: list[bytes] = []
    allow_missing = False
    for i, key in enumerate(text.replace(",", " ").split()):
        if key == ALLOW_MISSING_KEY:
            allow_missing = True
            continue
        try:
            keys.append(base64.b64decode(key, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise AuthError(f"failed to decode auth key at index {i}: {exc} (keys are standard base64)") from None
    if not keys:
        raise AuthError("at least one auth key must be provided (base64, separated by whitespace or commas)")
    return keys, allow_missing


class KeyedAuth:
    """Signs and verifies tokens with pre-shared keys (Gazette's auth.KeyedAuth)."""

    def __init__(self, keys: str) -> None:
        self.keys, self.allow_missing = parse_keys(keys)
        self._verified: dict[str, Claims] = {}
        _load_jwt()

    def sign(self, claims: Claims, ttl: float = TOKEN_TTL, *, now: float | None = None) -> str:
        """A token of `claims` issued now, expiring in `ttl` seconds, signed HS256 with the first key."""
        import jwt

        issued = int(time.time() if now is None else now)
        payload = Claims(claims.capability, claims.selector, issued, issued + max(1, int(ttl))).payload()
        return jwt.encode(payload, self.keys[0], algorithm="HS256")

    def verify(self, authorization: str | None, require: int) -> Claims:
        """Claims of an `authorization` metadata value (`Bearer <token>`) that grant `require`;
        raises AuthError saying what is wrong."""
        if not authorization:
            if self.allow_missing:
                return Claims(require, expires_at=int(time.time()) + 3600)
            raise AuthError("missing or empty Authorization token")
        if not authorization.startswith("Bearer "):
            raise AuthError("invalid or unsupported Authorization header (expected 'Bearer')")
        token = authorization[7:]
        claims = self._verified.get(token)
        if claims is None or claims.expires_at + LEEWAY_SECONDS < time.time():
            claims = self._decode(token)
            if len(self._verified) >= VERIFIED_CACHE_SIZE:
                self._verified.clear()
            self._verified[token] = claims
        check_capability(claims.capability, require)
        return claims

    def _decode(self, token: str) -> Claims:
        import jwt

        error: Exception | None = None
        for key in self.keys:
            try:
                payload = jwt.decode(
                    token, key, algorithms=VERIFY_ALGORITHMS, leeway=LEEWAY_SECONDS,
                    options={"require": ["exp"], "verify_iat": True},
                )
            except jwt.InvalidSignatureError as exc:
                error = exc
                continue
            except jwt.PyJWTError as exc:
                raise AuthError(f"verifying Authorization: {_jwt_reason(exc)}") from None
            if not isinstance(payload, dict):
                raise AuthError("verifying Authorization: the token's claims are not a JSON object")
            return Claims.from_payload(payload)
        raise AuthError(f"verifying Authorization: {_jwt_reason(error)}") from None


@functools.cache
def _load_jwt() -> None:
    """Import PyJWT, on first use: it imports `cryptography` (60 ms of every process's start-up,
    gazctl's too), which a process without auth keys never needs."""
    import jwt

    # Gazette takes keys of any length; PyJWT warns of HMAC keys shorter than the hash on every use.
    short_key_warning = getattr(getattr(jwt, "warnings", None), "InsecureKeyLengthWarning", None)
    if short_key_warning is not None:
        warnings.filterwarnings("ignore", category=short_key_warning)


def _jwt_reason(exc: Exception | None) -> str:
    import jwt

    if isinstance(exc, jwt.ExpiredSignatureError):
        return "token has expired"
    if isinstance(exc, jwt.InvalidSignatureError):
        return "token signature is invalid (not signed by any of the configured keys)"
    if isinstance(exc, jwt.ImmatureSignatureError):
        return "token is used before it was issued"
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"token is missing the required {exc.claim!r} claim"
    if isinstance(exc, jwt.InvalidAlgorithmError):
        return f"token algorithm is not allowed (expected one of {', '.join(VERIFY_ALGORITHMS)})"
    if isinstance(exc, jwt.DecodeError):
        return f"token is malformed: {exc}"
    return str(exc)


def check_capability(actual: int, require: int) -> None:
    """Raise AuthError naming the missing capability unless `actual` holds every bit of `require`."""
    if actual & require == require:
        return
    for cap in _NAMED:
        if require & cap and not actual & cap:
            raise AuthError(f"authorization is missing required {cap.name} capability")
    raise AuthError(
        f"authorization is missing required capability (have {actual:b}, but require {require:b})"
    )


def authorization_of(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The first `authorization` value of gRPC invocation metadata."""
    for key, value in metadata or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


async def verify_call(auth: KeyedAuth | None, context: grpc.aio.ServicerContext, require: int) -> Claims | None:
    """Verify the call's token for `require`, aborting it with UNAUTHENTICATED if it does not
    (Gazette's VerifiedJournalServer). None when no keys are configured: nothing is checked."""
    if auth is None:
        return None
    try:
        return auth.verify(authorization_of(context.invocation_metadata()), require)
    except AuthError as exc:
        await _unauthenticated(context, str(exc))


async def _unauthenticated(context: grpc.aio.ServicerContext, message: str) -> NoReturn:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
    raise AssertionError("unreachable")


def authorized(claims: Claims | None, label_set: pb.LabelSet) -> bool:
    """Whether `claims` (None: no auth configured) cover a journal or shard with `label_set`."""
    return claims is None or claims.authorizes(label_set)


class Signer:
    """The `authorization` metadata a client sends: a static bearer token, or tokens self-signed
    with keys (claims of every capability over everything: holding a key is holding every grant),
    renewed `RENEW_BEFORE` seconds before they expire. Thread-safe (Spark tasks share one)."""

    def __init__(self, *, token: str = "", keys: str = "", claims: Claims | None = None) -> None:
        if not token and not keys:
            raise AuthError("a Signer needs a token or keys")
        self._static = f"Bearer {token}" if token else ""
        self._auth = KeyedAuth(keys) if keys and not token else None
        self._claims = claims or Claims(Capability.ALL)
        self._lock = threading.Lock()
        self._current = ""
        self._renew_at = 0.0

    @property
    def token(self) -> str:
        """The static bearer token given (`--*.auth-token`); "" for a signer self-signing with keys."""
        return self._static.removeprefix("Bearer ")

    def authorization(self) -> str:
        """The metadata value: `Bearer <token>`."""
        if self._static:
            return self._static
        assert self._auth is not None
        now = time.time()
        if now >= self._renew_at:
            with self._lock:
                if now >= self._renew_at:
                    self._current = "Bearer " + self._auth.sign(self._claims, TOKEN_TTL, now=now)
                    self._renew_at = now + TOKEN_TTL - RENEW_BEFORE
        return self._current

    def metadata(self) -> tuple[tuple[str, str]]:
        return (("authorization", self.authorization()),)


__all__ = [
    "ALLOW_MISSING_KEY",
    "Capability",
    "Claims",
    "KeyedAuth",
    "Signer",
    "authorization_of",
    "authorized",
    "capability_names",
    "check_capability",
    "parse_capabilities",
    "parse_keys",
    "selector_json",
    "verify_call",
]
