"""Reading a compare back: ``holds`` says what etcd would have decided."""

from __future__ import annotations

import pytest

from etcdsched.store.kv import KV, Cmp, Compare, holds

KEY = KV("/t/k", b"v1", create_revision=5, mod_revision=9, version=3, lease=7)


def test_each_target_is_read_from_the_key_as_stored() -> None:
    assert holds(Cmp.created("/t/k", 5), [KEY]) and not holds(Cmp.created("/t/k", 6), [KEY])
    assert holds(Cmp.mod("/t/k", 9), [KEY]) and not holds(Cmp.mod("/t/k", 8), [KEY])
    assert holds(Compare("/t/k", "version", "==", 3), [KEY])
    assert holds(Compare("/t/k", "lease", "==", 7), [KEY])
    assert holds(Cmp.value("/t/k", b"v1"), [KEY]) and not holds(Cmp.value("/t/k", b"v2"), [KEY])


def test_an_absent_key_has_every_revision_zero_and_an_empty_value() -> None:
    assert holds(Cmp.absent("/t/k"), []) and not holds(Cmp.absent("/t/k"), [KEY])
    assert holds(Cmp.exists("/t/k"), [KEY]) and not holds(Cmp.exists("/t/k"), [])
    assert holds(Cmp.value("/t/k", b""), [])


def test_ordering_operators() -> None:
    assert holds(Cmp.unwritten_since("/t/k", 9), [KEY])  # mod < 10
    assert not holds(Cmp.unwritten_since("/t/k", 8), [KEY])
    assert holds(Compare("/t/k", "mod", "!=", 8), [KEY])


def test_range_compares_and_ordered_values_are_refused() -> None:
    with pytest.raises(ValueError):
        holds(Cmp.prefix_empty("/t/"), [])
    with pytest.raises(ValueError):
        holds(Compare("/t/k", "value", "<", b"z"), [KEY])
