"""The inline SVG speed-up histogram: well-formed, escaped, and every value counted in its bin."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from cuda_agent.evaluate.svg import histogram_svg

NS = "{http://www.w3.org/2000/svg}"


def bar_titles(svg: str) -> list[str]:
    return [rect.find(f"{NS}title").text for rect in ET.fromstring(svg).iter(f"{NS}rect")
            if rect.find(f"{NS}title") is not None]


def test_histogram_is_well_formed_xml_with_names_escaped() -> None:
    svg = histogram_svg({"run <a> & b": [1.5]}, "level1: speed-up vs compile & <more>")
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg"
    assert "run <a> & b: 1 in 1.41x" in bar_titles(svg)


def test_every_value_lands_in_its_half_octave_bin() -> None:
    values = [0.01, 0.5, 0.99, 1.0, 1.0, 1.9, 2.0, 100.0]
    titles = bar_titles(histogram_svg({"A": values}, "t"))
    counts = {re.sub(r"^A: \d+ in ", "", t): int(re.match(r"A: (\d+)", t).group(1)) for t in titles}
    assert counts == {"<0.125x": 1, "0.5x": 1, "0.707x": 1, "1x": 2, "1.41x": 1, "2x": 1, "≥8x": 1}
    assert sum(counts.values()) == len(values)


def test_histogram_axes_have_ticks_and_labels() -> None:
    root = ET.fromstring(histogram_svg({"A": [1.0, 1.0, 3.0]}, "t"))
    texts = [text.text for text in root.iter(f"{NS}text")]
    assert [t for t in texts if t.endswith("x")] == ["0.125x", "0.25x", "0.5x", "1x", "2x", "4x", "8x"]
    assert {"0", "1", "2", "tasks"} <= set(texts)
    assert any("half an octave" in t for t in texts)
