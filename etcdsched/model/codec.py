"""Encoding at the edge: records become JSON bytes only when written and
become models again as soon as they are read."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from etcdsched.model.errors import EtcdschedError

M = TypeVar("M", bound=BaseModel)


class CorruptRecord(EtcdschedError):
    """A stored value that does not parse as the record its key promises."""

    code = "corrupt_record"


STORED: dict[str, bool] = {"stored": True}
"""Serialization context of values written to etcd (compared by identity):
lets a field choose a more compact form there than in API responses (see
``models.SpecSnapshot``)."""


def encode(record: BaseModel) -> bytes:
    return record.model_dump_json(context=STORED).encode()


def decode(data: bytes, model: type[M], key: str = "") -> M:
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise CorruptRecord(f"{key or 'value'} is not a valid {model.__name__}: {exc}") from exc
