"""dcgm-exporter as a second GPU source, scraped from a local HTTP stub."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from agents.dcgm import DcgmBackend, parse

from .conftest import validate

EXPORT = """\
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-bbb",device="nvidia1"} 71
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3"} 45
DCGM_FI_DEV_MEM_COPY_UTIL{gpu="0",UUID="GPU-aaa",device="nvidia0"} 38
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-aaa"} 312.5
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aaa"} 2048
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1",UUID="GPU-bbb"} 2
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-aaa"} XIDVALUE
"""


@pytest.fixture
def exporter() -> Iterator[tuple[str, dict[str, str]]]:
    state = {"xid": "0"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = EXPORT.replace("XIDVALUE", state["xid"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics", state
    server.shutdown()


def test_it_parses_series_per_gpu_uuid() -> None:
    metrics = parse(EXPORT.replace("XIDVALUE", "79"))
    assert metrics["GPU-aaa"]["DCGM_FI_DEV_GPU_TEMP"] == 45
    assert metrics["GPU-bbb"]["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 2


def test_it_samples_in_index_order_with_missing_series_left_out(exporter) -> None:
    url, _ = exporter
    backend = DcgmBackend(url)
    assert backend.device_count() == 2
    first = backend.sample(0)
    assert (first["gpu"], first["index"], first["temp_c"]) == ("GPU-aaa", 0, 45)
    assert first["mem_used_bytes"] == 2048 * 1024 * 1024
    assert "ecc_dbe" not in first or first["ecc_dbe"] is None  # not exported for GPU 0
    second = backend.sample(1)
    assert (second["gpu"], second["ecc_dbe"]) == ("GPU-bbb", 2)
    validate([first, second])


def test_it_takes_the_device_name_and_memory_utilisation_where_exported(exporter) -> None:
    url, _ = exporter
    backend = DcgmBackend(url)
    first, second = backend.sample(0), backend.sample(1)
    assert (first["name"], first["mem_util_pct"]) == ("NVIDIA H100 80GB HBM3", 38.0)
    assert "name" not in second and "mem_util_pct" not in second  # not exported: absent
    validate([first, second])


def test_it_emits_an_xid_event_when_the_gauge_changes_not_while_it_stays(exporter) -> None:
    url, state = exporter
    backend = DcgmBackend(url, poll_s=0.1)
    events: list[dict] = []
    backend.start_events(events.append)
    time.sleep(0.4)
    state["xid"] = "79"
    deadline = time.monotonic() + 3
    while not events and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.4)  # the gauge keeps saying 79: no second event
    backend.close()
    assert [(e["event"], e["code"], e["gpu"]) for e in events] == [("xid", 79, "GPU-aaa")]


def test_it_names_itself_for_the_doctor_line_like_every_gpu_backend():
    # `faultline-agent doctor` prints backend.name; the DCGM backend lacked it.
    assert DcgmBackend("http://127.0.0.1:9400/metrics").name == "dcgm"


def test_it_reads_a_label_value_with_braces_and_quotes_through_the_shared_parser() -> None:
    text = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-aaa",modelName="H100 {SXM5} \\"80GB\\""} 51\n'
    assert parse(text) == {"GPU-aaa": {"DCGM_FI_DEV_GPU_TEMP": 51.0, "__index": 0.0}}
