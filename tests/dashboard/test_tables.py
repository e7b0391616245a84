"""The operator table's page as the server cuts it (:mod:`tensoropt.dashboard.tables`): the
DataTable's filter queries, as its filter row writes them, read as a person means them; every
expected page below is worked by hand from the six rows."""

from __future__ import annotations

import pytest

from tensoropt.dashboard.tables import table_page

ROWS = [{"node": "linear", "op": "aten.linear.default", "shard": "ZeRO-3", "n": "10"},
        {"node": "add", "op": "aten.add.Tensor", "shard": "", "n": "9"},
        {"node": "linear_1", "op": "aten.linear.default", "shard": "", "n": "100"},
        {"node": "Mul", "op": "aten.mul.Tensor", "shard": "ZeRO-1", "n": ""},
        {"node": "add_1", "op": "aten.add.Tensor", "shard": "ZeRO-3", "n": "2.5"},
        {"node": "view", "op": "aten.view.default", "shard": "", "n": "x"}]


def nodes(page):
    return [r["node"] for r in page[0]]


@pytest.mark.parametrize(("query", "want"), [
    # a term typed alone in a text column: the DataTable writes scontains (case-sensitive, its default)
    ("{op} scontains linear", ["linear", "linear_1"]),
    ('{op} contains "add"', ["add", "add_1"]),
    ("{node} scontains mul", []),
    ("{node} icontains mul", ["Mul"]),
    ("{shard} = ZeRO-3", ["linear", "add_1"]),
    ("{shard} eq ZeRO-3 && {op} contains add", ["add_1"]),
    ("{shard} != ZeRO-3", ["add", "linear_1", "Mul", "view"]),
    # numbers compare as numbers where both sides are numbers (10 > 9, not "10" < "9"), as text otherwise
    ("{n} > 9", ["linear", "linear_1"]),
    ("{n} le 9", ["add", "add_1"]),
    ("{n} >= w", ["view"]),
    ("{op} datestartswith aten.v", ["view"]),
    # a clause that cannot be read keeps nothing: a filter that is not applied must not look applied
    ("{op} resembles add", []),
    ("op contains add", []),
])
def test_the_filter_row_queries(query, want):
    assert nodes(table_page(ROWS, page=0, size=10, query=query)) == want


def test_sorting_numbers_by_value_text_after_and_empty_cells_last_both_ways():
    up = table_page(ROWS, page=0, size=10, sort_by=[{"column_id": "n", "direction": "asc"}])
    assert nodes(up) == ["add_1", "add", "linear", "linear_1", "view", "Mul"]
    down = table_page(ROWS, page=0, size=10, sort_by=[{"column_id": "n", "direction": "desc"}])
    assert nodes(down) == ["view", "linear_1", "linear", "add", "add_1", "Mul"]
    # equal keys keep the table's order (a stable sort): shard descending, then the rows as they came
    by_shard = table_page(ROWS, page=0, size=10, sort_by=[{"column_id": "shard", "direction": "desc"}])
    assert nodes(by_shard) == ["linear", "add_1", "Mul", "add", "linear_1", "view"]


def test_pages_of_the_filtered_sorted_rows_and_a_page_past_the_end():
    query, by = "{op} contains aten", [{"column_id": "node", "direction": "asc"}]
    assert table_page(ROWS, page=0, size=4, sort_by=by, query=query) == (
        [ROWS[3], ROWS[1], ROWS[4], ROWS[0]], 2)   # "Mul" before "add": upper case sorts first, as text does
    assert nodes(table_page(ROWS, page=1, size=4, sort_by=by, query=query)) == ["linear_1", "view"]
    # the filter shrank the table under the page on show: its last page, not an empty one
    assert table_page(ROWS, page=5, size=4, query="{op} contains add") == ([ROWS[1], ROWS[4]], 1)
    assert table_page([], page=0, size=15) == ([], 1)
