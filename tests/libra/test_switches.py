import pytest

from libra.errors import LibraError
from libra.switches import switch


@pytest.mark.parametrize("value, expected", [("1", True), ("TRUE", True), (" yes ", True), ("on", True), ("0", False),
                                             ("false", False), ("No", False), ("OFF", False), ("", None)])
def test_a_switch_reads_the_usual_spellings(monkeypatch, value, expected) -> None:
    monkeypatch.setenv("LIBRA_TEST_SWITCH", value)
    assert switch("LIBRA_TEST_SWITCH", True) is (True if expected is None else expected)
    assert switch("LIBRA_TEST_SWITCH", False) is (False if expected is None else expected)


def test_a_switch_of_another_value_is_refused_with_what_it_takes(monkeypatch) -> None:
    monkeypatch.delenv("LIBRA_TEST_SWITCH", raising=False)
    assert switch("LIBRA_TEST_SWITCH", True) is True
    monkeypatch.setenv("LIBRA_TEST_SWITCH", "maybe")  # LIBRA_DEBUG=false had turned tracebacks on
    with pytest.raises(LibraError, match=r"^LIBRA_TEST_SWITCH='maybe': give 1 \(or true, yes, on\) or 0 \(or false, no, "
                                         r"off\)$"):
        switch("LIBRA_TEST_SWITCH", True)
