"""The committed golden digests' table (rlparity.golden): keys, load, update."""

from __future__ import annotations

import json

from rlparity import golden


# ---- golden ------------------------------------------------------------------------------------------------
def test_golden_key_and_update(tmp_path):
    assert golden.key("bf16", (1, 128, 4096), 0, "grad") == "bf16/1x128x4096/seed0/grad"
    assert golden.load("exact", tmp_path) == {}
    golden.update("exact", {"b": "2", "a": "1"}, tmp_path)
    p = golden.update("exact", {"b": "3", "c": "4"}, tmp_path)
    assert p == tmp_path / "exact.json"
    assert list(json.loads(p.read_text()).items()) == [("a", "1"), ("b", "3"), ("c", "4")]
    assert golden.load("exact", tmp_path) == {"a": "1", "b": "3", "c": "4"}
    assert golden.load("fast", tmp_path) == {}
