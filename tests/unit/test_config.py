"""Config checks that catch a setting which would silently not work."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from etcdsched.config import Config


def test_a_lookahead_past_the_horizon_is_refused_naming_both() -> None:
    with pytest.raises(ValidationError, match=r"horizon_ms .* lookahead_ms"):
        Config(lookahead_ms=70_000, horizon_ms=60_000)


def test_a_worker_may_offer_more_slots_than_one_run_may_ask_for() -> None:
    assert Config(worker_slots=50_000).worker_slots == 50_000
    with pytest.raises(ValidationError, match="worker_slots"):
        Config(worker_slots=2_000_000)
