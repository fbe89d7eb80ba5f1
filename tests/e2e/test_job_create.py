"""Creating a job twice under one id, on a real etcd (``JobService.create``)."""

from __future__ import annotations

import pytest

from etcdsched.model.errors import Conflict
from etcdsched.model.spec import JobSpec
from etcdsched.runtime.clock import FakeClock
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys


async def test_a_second_create_in_the_same_millisecond_is_a_conflict(
    store: EtcdStore, keys: Keys
) -> None:
    """The clock does not move: the second create has the first one's
    creation instant and spec, and must still not pass for it."""
    jobs = JobService(store, keys, FakeClock(), 4)
    spec = JobSpec.model_validate({"trigger": {"kind": "now"}, "execution": {"argv": ["true"]}})
    await jobs.create(spec, "dup")
    with pytest.raises(Conflict) as info:
        await jobs.create(spec, "dup")
    assert info.value.field == "id"
