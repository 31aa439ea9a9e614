"""Figures: what reaches Plotly from the store is text, never markup."""

from __future__ import annotations

from dashboards.figures import Series, Span, bars, lines, text, timeline


def test_text_from_the_store_is_escaped_and_newlines_break_lines() -> None:
    assert text('<a href="javascript:alert(1)">x</a> & co\nnext') == '&lt;a href="javascript:alert(1)"&gt;x&lt;/a&gt; &amp; co<br>next'
    assert text(3.5) == 3.5 and text(None) is None


def test_names_hover_texts_and_categories_are_escaped_in_every_chart() -> None:
    hostile = "<b onmouseover=x>tool</b>"
    escaped = "&lt;b onmouseover=x&gt;tool&lt;/b&gt;"
    line = lines("k", "t", "x", "y", [Series(hostile, [0, 1], [1.0, 2.0], hover=[hostile, "ok"])], empty="none")
    trace = line.figure["data"][0]
    assert trace["name"] == escaped and trace["hovertext"] == [escaped, "ok"]
    bar = bars("k", "t", "x", "y", [Series("s", [hostile], [1])], empty="none")
    bar_trace = bar.figure["data"][0]
    assert bar_trace["x"] == [escaped]
    chart = timeline("k", "t", "s", [Span(hostile, 0.0, 1.0, hostile, hostile)], empty="none")
    spans = chart.figure["data"][0]
    assert (spans["name"], spans["y"], spans["hovertext"]) == (escaped, [escaped], [escaped])
