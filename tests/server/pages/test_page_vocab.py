"""Every page hands its scripts the shared vocabularies exactly as agents/vocab.py has them."""

from __future__ import annotations

import json
import re

import pytest

from agents import vocab

pytestmark = pytest.mark.django_db

_TAG = re.compile(r'<script id="console-vocab" type="application/json">(.*?)</script>', re.S)


def _handed(html: str) -> dict:
    m = _TAG.search(html)
    assert m, "the page hands its scripts no console-vocab"
    return json.loads(m.group(1))


def test_the_fleet_page_hands_its_scripts_the_vocabularies(client, cast):
    client.force_login(cast["viewer"])
    html = client.get("/").content.decode()
    assert _handed(html) == {
        "HEALTH": {
            "OK": vocab.HEALTH_OK,
            "UNKNOWN": vocab.HEALTH_UNKNOWN,
            "WARNING": vocab.HEALTH_WARNING,
            "CRITICAL": vocab.HEALTH_CRITICAL,
            "DOWN": vocab.HEALTH_DOWN,
        },
        "HEALTH_ORDER": list(vocab.HEALTH_ORDER),
        "SEVERITY_ORDER": list(vocab.SEVERITY_ORDER),
        "GROUP_STATES": list(vocab.GROUP_STATES),
        "TERMINAL_GROUP_STATES": [
            s for s in vocab.GROUP_STATES if s in vocab.TERMINAL_GROUP_STATES
        ],
        "HARDWARE_FAULT_KINDS": sorted(vocab.HARDWARE_FAULT_KINDS),
    }
    # The legend is drawn from the same order, best to worst.
    legend = re.findall(r'<span><i class="health-([a-z]+)"></i>', html)
    assert legend == list(vocab.HEALTH_ORDER)
    # fleet.js and common.js read them from the page, after it.
    assert html.index('id="console-vocab"') < html.index("console/common.js")
