import pyarrow as pa

from tasks.tracking_tasks import spreadsheet_safe


def test_a_text_cell_a_spreadsheet_would_run_as_a_formula_is_written_as_text():
    """An imported trace's tool name `=HYPERLINK(...)` reached tool_statistics.csv as it was, and a
    spreadsheet opening the artifact ran it (a quoted CSV field is still a formula)."""
    table = pa.table({"tool_name": ['=HYPERLINK("http://e.x","y")', "+1", "-x", "@sum", "\tcmd", "search", None],
                      "calls": [1, 2, 3, 4, 5, 6, 7]})
    assert spreadsheet_safe(table).to_pydict() == {
        "tool_name": ['\'=HYPERLINK("http://e.x","y")', "'+1", "'-x", "'@sum", "'\tcmd", "search", None],
        "calls": [1, 2, 3, 4, 5, 6, 7]}
    assert spreadsheet_safe(table).schema == table.schema
