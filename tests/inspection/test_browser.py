"""The ``attnlab inspect`` page as a person sees it: opened in headless Chromium, it renders
with no console message, every expected panel is in the DOM, it fetches nothing, and its
screenshot is not blank and shows as many panels as the page says it drew."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from attnlab.config import load_config
from attnlab.inspection import capture, write_page
from attnlab.model.transformer import build_model
from tests.helpers.browser import run_browser

PROMPT = "The identity head passes each token's own value on; attention mixes."  # 64 bytes
WIDTH = 1280


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    ids = list(PROMPT.encode())[:64]
    assert len(ids) == 64
    caps = []
    for preset in ("tiny", "tiny-identity-head"):
        torch.manual_seed(0)
        model = build_model(load_config(preset).model)
        decode = lambda t: bytes(t).decode("utf-8", "replace")  # noqa: E731
        caps.append(capture(model, ids, decode, name=preset, target=preset, mask_name="causal"))
    return write_page(tmp_path_factory.mktemp("page") / "page.html", caps), caps


def expected_panels(caps) -> dict[str, int]:
    """Panels by kind the page must draw for two models on the same tokens."""
    heads = [sum(m.shape[0] for lv in c.layers for m in lv.maps.values()) for c in caps]
    token_views = sum(len(p.tokens) for c in caps for p in c.parts)
    number_views = sum(bool(p.summary or p.numbers) for c in caps for p in c.parts)
    return {
        "mask": 2,
        "predictions": 2,
        "attention": sum(heads),
        "difference": min(heads),
        "part": token_views,
        "part-numbers": number_views,
    }


def test_the_page_is_self_contained(page):
    text = page[0].read_text(encoding="utf-8")
    assert not re.search(r"https?://", text)
    assert not re.search(r"\b(src|href)\s*=", text)
    assert "fetch(" not in text and "XMLHttpRequest" not in text and "import(" not in text


def test_the_page_renders_in_chromium_without_console_errors(page):
    path, caps = page
    dom, console = run_browser(path, "--dump-dom")
    assert console == []
    assert 'data-rendered="yes"' in dom
    want = expected_panels(caps)
    got = {k: len(re.findall(rf'class="panel" data-kind="{k}"', dom)) for k in want}
    assert got == want
    assert int(re.search(r'data-panels="(\d+)"', dom).group(1)) == sum(want.values())
    assert "identity" in dom  # the identity head's column label


def test_the_screenshot_shows_the_panels(page, tmp_path):
    from matplotlib.image import imread
    from scipy import ndimage

    path, caps = page
    dom, _ = run_browser(path, "--dump-dom", f"--window-size={WIDTH},6000")
    visible = int(re.search(r'data-visible-panels="(\d+)"', dom).group(1))
    shot = tmp_path / "page.png"
    _, console = run_browser(path, f"--screenshot={shot}", f"--window-size={WIDTH},6000")
    assert console == [] and shot.is_file()
    rgb = np.rint(imread(shot)[..., :3] * 255).astype(np.int16)
    assert rgb.std() > 20  # not blank
    # every panel is filled with #fafbff around its canvas: one connected region per drawn panel
    fill = np.abs(rgb - np.array([250, 251, 255])).max(-1) <= 2
    labels, _ = ndimage.label(fill)
    boxes = ndimage.find_objects(labels)
    panels = [b for b in boxes if b[0].stop - b[0].start > 40 and b[1].stop - b[1].start > 40]
    # the predictions tables are folded away (closed <details>): drawn panels only
    assert visible == sum(expected_panels(caps).values()) - 2
    assert len(panels) == visible
