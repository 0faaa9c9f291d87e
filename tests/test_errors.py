"""How errors show what they compare: two different digests never read the same."""

import pytest

from trn.errors import differing_digests

A = "b607220f2975d8f42c1e0a9b6d55e4a1c0ffee00112233445566778899aabbcc"


@pytest.mark.parametrize("at", [0, 5, 11, 12, 20, 63])
def test_two_digests_differing_anywhere_are_shown_different(at):
    b = A[:at] + ("0" if A[at] != "0" else "1") + A[at + 1:]
    shown = differing_digests(A, b)
    assert shown[0] != shown[1]
    assert A.startswith(shown[0].removesuffix("...")) and b.startswith(shown[1].removesuffix("..."))
    assert len(shown[0].removesuffix("...")) == max(12, min(64, at + 5))


def test_equal_or_short_digests_are_shown_as_they_are():
    assert differing_digests(A, A, shown=12) == (A[:64], A[:64])  # equal: nothing tells them apart
    assert differing_digests("abc", "abd") == ("abc", "abd")
