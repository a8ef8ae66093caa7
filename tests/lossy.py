"""Values the earlier JSON codec changed silently: now each round-trips exactly or is refused at dispatch."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pydantic


class Login(pydantic.BaseModel):
    """`SecretStr` is dumped masked: refused."""

    user: str
    password: pydantic.SecretStr


class Profile(pydantic.BaseModel):
    """A `Field(exclude=True)` field would come back as its default: refused unless it holds the default."""

    name: str
    cache_key: str = pydantic.Field(default="", exclude=True)


class Account(pydantic.BaseModel):
    """Aliases, and separate validation/serialization aliases: round-trip."""

    user_id: int = pydantic.Field(alias="userId")
    display: str = pydantic.Field(validation_alias="displayIn", serialization_alias="displayOut")


@dataclass(frozen=True)
class Reference:
    """`str | UUID` shares the JSON string: refused."""

    ref: str | uuid.UUID


@dataclass(frozen=True)
class Reading:
    """`float | str`: the string "NaN" stays a string; a float NaN has no JSON form and is refused."""

    value: float | str
