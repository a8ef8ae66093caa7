"""Encryption at rest (SPEC 22): payloads sealed with AES-256-GCM before they leave the process.

A sealed payload is stored as a JSON object of one key, `MARKER`, whose value is the text
``1.<key id>.<binding>.<base64url(nonce + ciphertext + tag)>``:

- the key id is the first 16 hex digits of SHA-256 over the key (never the key), so a reader finds the key
  that wrote it and a missing key can be named;
- each seal draws a fresh random 96-bit nonce;
- the associated data binds the ciphertext to where it belongs: the version, the field (configuration,
  execution, result or step:NAME), the binding kind and the job's id (`BIND_ID`). A sealed value copied
  to another row, another field or another step fails to open. A debounced job's configuration is bound
  to its type instead (`BIND_TYPE`): debounce moves a later call's configuration onto the queued job of
  the same key, whose id the producer cannot know.

Empty objects (`{}`) and None hold nothing and are stored as they are. Keys are url-safe base64 of 32
random bytes (`generate_key`). The cipher comes from the optional `cryptography` package (`jobbus[encryption]`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from jobbus.errors import JobbusError
from jobbus.jsontext import dumps, loads
from jobbus.models import Job

#: The one key of a sealed payload's JSON object. A clear payload of exactly this one key is read as sealed.
MARKER = "$jobbus.encrypted"
VERSION = "1"
#: How the JSON text of every sealed payload starts.
SEALED_PREFIX = '{"' + MARKER + '":"'
BIND_ID = "i"
BIND_TYPE = "t"
KEY_BYTES = 32
NONCE_BYTES = 12
KEY_ID_DIGITS = 16


class MissingKeyError(JobbusError):
    """A payload was sealed with a key this process does not hold (its id is `key_id`)."""

    def __init__(self, key_id: str, what: str) -> None:
        super().__init__(
            f"{what} is encrypted with key {key_id}, which is not among this process's encryption_keys "
            "(JOBBUS_ENCRYPTION_KEYS): add that key (after the newest) to read it"
        )
        self.key_id = key_id


class EncryptionUnavailableError(JobbusError, ImportError):
    """Keys are configured and the `cryptography` package is not installed."""


class UnreadablePayloadError(JobbusError):
    """A sealed payload that no listed key opens: altered, truncated or copied from another row."""


def generate_key() -> str:
    """A new key: url-safe base64 of 32 random bytes (what `jobbus keys generate` prints)."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode()


def parse_key(text: str, position: int) -> bytes:
    """The 32 bytes of a key, or a `ValueError` naming the problem (never the key itself)."""
    where = f"encryption_keys[{position}]"
    if not isinstance(text, str):
        raise ValueError(f"{where} must be a string (url-safe base64 of 32 bytes), got a {type(text).__name__}")
    stripped = text.strip()
    try:
        key = base64.urlsafe_b64decode(stripped.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise ValueError(
            f"{where} is not url-safe base64 ({len(stripped)} characters): use `jobbus keys generate` to make a key"
        ) from None
    if len(key) != KEY_BYTES:
        raise ValueError(
            f"{where} decodes to {len(key)} bytes, a key is {KEY_BYTES} bytes (44 characters of url-safe base64): "
            "use `jobbus keys generate` to make a key"
        )
    return key


def key_id(key: bytes) -> str:
    """The id stored beside every payload a key seals: a short digest, from which the key cannot be found."""
    return hashlib.sha256(b"jobbus key id\x00" + key).hexdigest()[:KEY_ID_DIGITS]


def sealed_key_id(value: object) -> str | None:
    """The id of the key that sealed `value`, or None for a payload stored in clear."""
    if type(value) is dict and len(value) == 1:
        text = value.get(MARKER)
        if isinstance(text, str):
            parts = text.split(".", 3)
            return parts[1] if len(parts) == 4 else ""
    return None


@dataclass(frozen=True, slots=True, repr=False)
class Keyring:
    """The listed keys, newest first: seals with the newest, opens with whichever wrote a payload."""

    ids: tuple[str, ...]
    _ciphers: dict[str, Any]

    def __repr__(self) -> str:
        return f"Keyring(ids={list(self.ids)!r})"

    @property
    def newest_id(self) -> str:
        return self.ids[0]

    # -- sealing -------------------------------------------------------------------------------------

    def seal_text(self, text: str, field: str, job_id: uuid.UUID | str, *, bind: str = BIND_ID) -> str:
        """JSON text of `text` (JSON of a payload) sealed with the newest key; ``{}`` and ``null`` stay."""
        if text in ("{}", "null"):
            return text
        kid = self.ids[0]
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[kid].encrypt(nonce, text.encode(), _aad(field, bind, str(job_id)))
        body = base64.urlsafe_b64encode(nonce + sealed).decode()
        return '{"' + MARKER + '":"' + f'{VERSION}.{kid}.{bind}.{body}"' + "}"

    # -- opening -------------------------------------------------------------------------------------

    def open(self, value: Any, field: str, job_id: uuid.UUID | str, job_type: str, what: str) -> Any:
        """`value` as written: opened when sealed (`MissingKeyError` when its key is not listed,
        `UnreadablePayloadError` when it does not open), else as it is."""
        kid = sealed_key_id(value)
        if kid is None:
            return value
        if not kid:
            raise UnreadablePayloadError(f"{what} is marked as encrypted but is not an encrypted payload")
        version, _, bind, body = value[MARKER].split(".", 3)
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise MissingKeyError(kid, what)
        binding = str(job_id) if bind == BIND_ID else job_type
        try:
            raw = base64.urlsafe_b64decode(body.encode("ascii"))
            clear = cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(field, bind, binding, version))
        except Exception:
            raise UnreadablePayloadError(
                f"{what} (encrypted with key {kid}) does not open: it was altered or belongs to another job"
            ) from None
        return loads(clear)

    def resealed(
        self, text: str | None, field: str, job_id: uuid.UUID | str, job_type: str, *, clear_bind: str = BIND_ID
    ) -> str | None:
        """JSON text of `text` (a stored payload's JSON) sealed with the newest key, or None when there is
        nothing to do: empty, or sealed with the newest key already. A payload sealed before keeps its
        binding; one in clear takes `clear_bind`. Raises as `open` does."""
        if text is None:
            return None
        value = loads(text)
        if value is None or value == {}:
            return None
        kid = sealed_key_id(value)
        if kid == self.ids[0]:
            return None
        if kid is None:
            clear, bind = text, clear_bind
        else:
            clear = dumps(self.open(value, field, job_id, job_type, f"the {field} of job {job_id}"))
            bind = value[MARKER].split(".", 3)[2]
        return self.seal_text(clear, field, job_type if bind == BIND_TYPE else job_id, bind=bind)


def _aad(field: str, bind: str, binding: str, version: str = VERSION) -> bytes:
    return f"jobbus\x00{version}\x00{field}\x00{bind}\x00{binding}".encode()


def open_job(job: Job, keyring: Keyring | None, *, strict: bool = False) -> Job:
    """`job` with its sealed payloads opened. A payload this keyring cannot open stays sealed (its envelope
    names the key), or with `strict` raises `MissingKeyError` / `UnreadablePayloadError`."""
    fields = {"configuration_data": "configuration", "execution_data": "execution", "result": "result"}
    values = {name: getattr(job, name) for name in fields}
    steps = job.steps
    if all(sealed_key_id(v) is None for v in values.values()) and all(sealed_key_id(v) is None for v in steps.values()):
        return job
    changes: dict[str, Any] = {}
    for name, field in fields.items():
        opened = _opened(keyring, values[name], field, job, f"the {field} of job {job.id}", strict)
        if opened is not values[name]:
            changes[name] = opened
    opened_steps = {
        step: _opened(keyring, value, f"step:{step}", job, f"step {step!r} of job {job.id}", strict)
        for step, value in steps.items()
    }
    changes["steps"] = opened_steps
    return replace(job, **changes)


def _opened(keyring: Keyring | None, value: Any, field: str, job: Job, what: str, strict: bool) -> Any:
    kid = sealed_key_id(value)
    if kid is None:
        return value
    try:
        if keyring is None:
            raise MissingKeyError(kid, what)
        return keyring.open(value, field, job.id, job.type, what)
    except (MissingKeyError, UnreadablePayloadError):
        if strict:
            raise
        return value


def placeholder(value: object) -> str | None:
    """What a reader shows for a payload it cannot open (None for a value it can show)."""
    kid = sealed_key_id(value)
    return None if kid is None else f"<encrypted with key {kid}, not held here>"


def keyring_of(keys: Sequence[str]) -> Keyring | None:
    """The keyring of `keys` (newest first), or None without keys; bad keys raise `ValueError`."""
    if not keys:
        return None
    return _keyring(tuple(keys))


@functools.lru_cache(maxsize=8)
def _keyring(keys: tuple[str, ...]) -> Keyring:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise ImportError("encryption_keys need the cryptography package: pip install 'jobbus[encryption]'") from None
    ciphers: dict[str, Any] = {}
    ids: list[str] = []
    for position, text in enumerate(keys):
        key = parse_key(text, position)
        kid = key_id(key)
        if kid in ciphers:
            raise ValueError(f"encryption_keys[{position}] repeats an earlier key (id {kid})")
        ciphers[kid] = AESGCM(key)
        ids.append(kid)
    return Keyring(tuple(ids), ciphers)
