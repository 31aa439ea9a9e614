import pytest

from libra.checks import count_of, field_range, in_range
from libra.config import PlannerConfig, TracesConfig
from libra.errors import LibraError


@pytest.mark.parametrize("text, most, value", [
    ("0", 5, 0), ("5", 5, 5), ("0005", 5, 5), ("000", 0, 0), ("6", 5, None), ("", 5, None), ("-1", 5, None),
    ("+1", 5, None), (" 1", 5, None), ("1_0", 20, None), ("١", 5, None),  # (an Arabic-Indic one: int() takes it)
    ("1e3", 5000, None), ("10", 9, None), ("99", 99, 99), ("100", 99, None),
])
def test_a_count_is_ascii_digits_up_to_the_most(text, most, value) -> None:
    assert count_of(text, most) == value


def test_a_count_of_any_length_is_answered_without_int_refusing_it() -> None:
    assert count_of("9" * 5_000, 10**18) is None  # int() refuses 4,301 digits with a ValueError of its own
    assert count_of("0" * 1_000_000 + "7", 10) == 7
    assert count_of("1" + "0" * 4_000_000, 10**18) is None  # (int() would raise past 4,300 digits)


def test_a_number_out_of_range_names_its_flag() -> None:
    in_range("--steps", 5, 1, 10)
    in_range("--steps", None, 1, 10)
    with pytest.raises(LibraError, match=r"^--steps must be <= 10, got 11$"):
        in_range("--steps", 11, 1, 10)
    with pytest.raises(LibraError, match=r"^--pace must be a finite number, got nan$"):
        in_range("--pace", float("nan"), 0, 10)


def test_a_parameter_takes_the_range_of_the_config_field_it_overrides() -> None:
    assert field_range(TracesConfig, "prompts_per_step") == (1, 100_000)
    assert field_range(PlannerConfig, "batch_trajectories") == (1, 1_000_000)
