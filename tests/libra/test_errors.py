from libra.errors import first_line


def test_an_error_in_one_line_is_its_first_line_or_its_type():
    assert first_line(ValueError("bad\nmore")) == "bad"
    assert first_line(ValueError("\n  \n  bad  \nmore")) == "bad"
    assert first_line(ValueError("bad\nmore"), typed=True) == "ValueError: bad"
    assert first_line(ConnectionError()) == "ConnectionError"  # (`str(exc).splitlines()[0]` raised IndexError)
    assert first_line(RuntimeError(""), typed=True) == "RuntimeError"
    assert first_line(KeyError("k")) == "'k'"
