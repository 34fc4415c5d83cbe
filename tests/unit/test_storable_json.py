"""The JSON text every result, answer and payload is stored as: an encoder made once, the same text as ``json``'s.

``storable_json`` encodes with CPython's C encoder made once per thread (``json`` makes one per call); what it
writes must be exactly what ``json.JSONEncoder(separators=(",", ":"), allow_nan=False)`` writes, and the errors
the same.
"""

from __future__ import annotations

import enum
import json
import math
from concurrent.futures import ThreadPoolExecutor

import pytest

from recovery_ext._conventions import _checked, _strict, storable_json


class Colour(enum.StrEnum):
    RED = "red"


VALUES = [
    None, True, False, 0, -1, 2**70, 0.1 + 0.2, 1e300, -0.0, "", "plain", "quote \" and \\ backslash",
    "non-ASCII: é ✓ 𝄞", "\u2028 line separator", [], {}, [1, [2, [3, {"a": None}]]],
    {"b": 1, "a": [True, None, 1.5]}, {1: "int key", 2.5: "float key", False: "bool key", None: "None key"},
    ("a", "tuple"), Colour.RED, {"status": Colour.RED}, {"i": 7, "label": "item 7"},
]


@pytest.mark.parametrize("value", VALUES, ids=[repr(v)[:40] for v in VALUES])
def test_the_encoder_made_once_writes_what_json_writes(value):
    assert _strict(value) == _checked(value)
    assert json.loads(storable_json(value)) == json.loads(_checked(value))


def test_the_encoder_made_once_is_the_one_in_use_here():
    """CPython has the C encoder: the fast form is the one every store write uses."""
    assert _strict is not _checked


def test_a_value_that_holds_itself_is_refused_by_name():
    loop: list = [1]
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        storable_json(loop)
    cycle: dict = {}
    cycle["self"] = {"again": cycle}
    with pytest.raises(ValueError, match="Circular reference"):
        storable_json({"wrapped": cycle})


def test_a_value_refused_mid_way_does_not_leave_its_containers_taken_for_a_cycle():
    """The encoder keeps the containers it is inside while it encodes; an error leaves them there unless cleared."""
    value = {"outer": [1, {"bad": {1, 2}}]}
    with pytest.raises(TypeError):
        storable_json(value)
    value["outer"][1]["bad"] = [1, 2]
    assert _strict(value) == storable_json(value) == '{"outer":[1,{"bad":[1,2]}]}'


def test_what_json_does_not_know_is_refused_and_nan_is_stored_as_null():
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        storable_json({"a": {1, 2}})
    assert storable_json({"x": math.nan, "y": [math.inf, 1.0]}) == '{"x":null,"y":[null,1.0]}'
    assert storable_json("a\u0000b") == '"a\\ufffdb"'


def test_threads_share_the_encoder_made_once():
    values = [{"i": i, "nested": [i, {"k": str(i)}]} for i in range(2000)]
    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(storable_json, values))
    assert texts == [_checked(v) for v in values]
