"""The bounds every user file is read with, as properties: YAML (aliases, size with aliases expanded,
nesting, values PyYAML cannot build), JSON nesting, the characters no store keeps, and the CSV cells
sense7 writes (never a formula)."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sense7.files import (FORMULA_START, MAX_YAML_ALIASES, MAX_YAML_DEPTH, MAX_YAML_NODES, YAMLInputError,
                          csv_text, forbidden_character, load_yaml, spreadsheet_cell)
from sense7.readers.formats import MAX_JSON_DEPTH, JSONTooDeep, id_problem, parse_json


def alias_chain(levels: int, fan_out: int) -> str:
    """The "billion laughs" shape: each level a list of `fan_out` aliases of the level before."""
    name = "abcdefghijkl"
    lines = ["a: &a [" + ",".join(["lol"] * fan_out) + "]"]
    lines += [f"{name[i]}: &{name[i]} [" + ",".join([f"*{name[i - 1]}"] * fan_out) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def expanded_size(levels: int, fan_out: int) -> int:
    """Values in the chain's document with every alias expanded (the mapping, its keys, every list)."""
    size_of_level, total = fan_out + 1, 1 + 1 + fan_out + 1  # l0: its list and strings; the mapping, key l0
    for _ in range(1, levels):
        size_of_level = 1 + fan_out * size_of_level
        total += 1 + size_of_level
    return total


@settings(max_examples=200, deadline=None)
@given(levels=st.integers(1, 12), fan_out=st.integers(1, 12))
def test_aliases_load_within_the_bounds_and_are_refused_beyond_them(levels, fan_out):
    text = alias_chain(levels, fan_out)
    aliases = (levels - 1) * fan_out
    try:
        values, _ = load_yaml(text, "study.yaml")
    except YAMLInputError as exc:
        assert aliases > MAX_YAML_ALIASES or expanded_size(levels, fan_out) > MAX_YAML_NODES, str(exc)
        assert str(exc).startswith("study.yaml:") and "\n" not in str(exc)
        assert ("aliases" in exc.reason) and exc.line is not None
        return
    assert aliases <= MAX_YAML_ALIASES and expanded_size(levels, fan_out) <= MAX_YAML_NODES
    assert len(values) == levels


def test_the_376_byte_bomb_is_one_line_naming_file_line_and_field():
    bomb = alias_chain(9, 9)
    assert len(bomb.encode()) < 376
    with pytest.raises(YAMLInputError) as refused:
        load_yaml(bomb, "study.yaml")
    assert refused.value.line is not None and refused.value.field[0] in "abcdefghi"
    assert str(refused.value) == f"study.yaml:{refused.value.line}: {refused.value.field}: {refused.value.reason}"


@given(depth=st.integers(1, 3 * MAX_YAML_DEPTH), flow=st.booleans())
def test_nesting_is_bounded_in_flow_and_block_style(depth, flow):
    if flow:
        text = "a: " + "[" * depth + "1" + "]" * depth + "\n"
    else:
        text = "".join("  " * i + f"k{i}:\n" for i in range(depth)) + "  " * depth + "1\n"
    # "a: [...]" nests the lists in the document's mapping; the block keys are mappings of their own.
    nested = depth + 1 if flow else depth
    if nested <= MAX_YAML_DEPTH:
        assert load_yaml(text, "f.yaml")[0] is not None
    else:
        with pytest.raises(YAMLInputError, match=f"nested deeper than {MAX_YAML_DEPTH} levels"):
            load_yaml(text, "f.yaml")


def test_an_alias_of_its_own_container_is_refused():
    with pytest.raises(YAMLInputError, match="refers to a value that holds it"):
        load_yaml("a: &a [1, *a]\n", "f.yaml")


@settings(max_examples=300, deadline=None)
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)
       | st.lists(st.sampled_from(["a:", " ", "\n", "- ", "&x ", "*x", "[", "]", "{", "}", ", ", "!!int ", "!!binary ",
                                   "2020-13-01", '"\\0"', '"\\ud800"', "? ", ": ", "---\n", "|\n", "'", '"', "#"]),
                  max_size=40).map("".join))
def test_any_text_loads_or_is_one_yaml_input_error(text):
    """Whatever a user writes, the reader answers with values or one line naming the file: never another
    exception (PyYAML itself raises ValueError for 2020-13-01 or `!!int x`)."""
    try:
        load_yaml(text, "f.yaml")
    except YAMLInputError as exc:
        assert str(exc).startswith("f.yaml") and "\n" not in str(exc)


@pytest.mark.parametrize("text", ['a: "x\\0y"', 'a: "\\ud800"', '"k\\0": 1'])
def test_yaml_scalars_no_store_keeps_are_refused(text):
    with pytest.raises(YAMLInputError, match="the store cannot keep it"):
        load_yaml(text, "f.yaml")


@settings(max_examples=100, deadline=None)
@given(depth=st.integers(1, 3 * MAX_JSON_DEPTH), before=st.integers(0, 3), kind=st.sampled_from(["[]", "{}"]))
def test_json_nesting_is_bounded_and_the_refusal_names_the_line(depth, before, kind):
    opening = "[" if kind == "[]" else '{"k": '
    closing = "]" if kind == "[]" else "}"
    text = "\n" * before + opening * depth + "1" + closing * depth
    if depth <= MAX_JSON_DEPTH:
        assert parse_json(text) is not None
        return
    with pytest.raises(JSONTooDeep) as refused:
        parse_json(text)
    assert refused.value.line == before + 1


def test_json_nested_beyond_pythons_recursion_limit_is_refused_not_a_recursion_error():
    with pytest.raises(JSONTooDeep) as refused:
        parse_json('{"a": "[[[ in a string", "b":\n' + "[" * 100_000 + "]" * 100_000 + "}")
    assert refused.value.line == 2 and refused.value.column == MAX_JSON_DEPTH


@given(st.text(max_size=30))
def test_characters_no_store_keeps_are_named(text):
    why = forbidden_character(text)
    assert (why is None) == ("\x00" not in text and not any(0xD800 <= ord(c) <= 0xDFFF for c in text))


@given(st.text(max_size=40))
def test_ids_never_start_a_formula(text):
    if id_problem(text) is None:
        assert not text.startswith(FORMULA_START) and "\x00" not in text


@settings(max_examples=300)
@given(cells=st.lists(st.one_of(st.text(max_size=20), st.integers(), st.floats(allow_nan=False),
                                st.sampled_from(["=cmd|' /C calc'!A0", "+1+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1",
                                                 "-3", "+4.5", "-1e5", "=", "-", "'=x"])), min_size=1, max_size=6))
def test_no_csv_cell_sense7_writes_starts_a_formula_and_no_text_is_lost(cells):
    written = next(csv.reader(io.StringIO(csv_text([cells]), newline="")))
    for given_cell, cell in zip(cells, written):
        if cell.startswith(FORMULA_START):
            float(cell)  # only a number may start so
        if isinstance(given_cell, str):
            assert cell == given_cell or cell == "'" + given_cell
        assert spreadsheet_cell(spreadsheet_cell(given_cell)) == spreadsheet_cell(given_cell)
