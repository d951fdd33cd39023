"""`faultline demo`: a real service, real agents and a simulated workload failing on schedule.

Also the fake NVML control channel the demo uses to break a running agent's GPU.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import time
import tomllib
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agents.cli import _parser, build_config
from agents.fake_nvml import CONTROL_ENV, FakeNvml
from agents.serving_scrape import EngineScraper
from faultline.demo import fake_slurm
from faultline.demo.fleet import Fleet
from faultline.demo.runner import agent_toml, serving_engines
from faultline.demo.scenario import MATRIX, SPARE, Fault, layout
from faultline.demo.serving import ServingGroup
from faultline.embedded import free_port
from faultline.testing.service import ADMIN, Service, service_env, wait_for
from tests.system.conftest import BIN


def _events(gpus: FakeNvml) -> list[dict]:
    seen: list[dict] = []
    gpus.start_events(seen.append)
    return seen


def test_it_applies_control_lines_appended_while_the_agent_runs(tmp_path: Path) -> None:
    control = tmp_path / "node-1"
    gpus = FakeNvml("node-1", 4, control=control)
    events = _events(gpus)
    gpus.sample(0)
    control.write_text("2:xid79\n")
    sample = gpus.sample(0)
    assert sample["gpu"] == gpus.uuid(0) and "temp_c" in sample
    assert [(e["event"], e.get("code")) for e in events] == [("xid", 79), ("gpu_lost", None)]
    assert "temp_c" not in gpus.sample(2)  # a lost GPU reports every field missing


def test_it_applies_each_control_line_once(tmp_path: Path) -> None:
    control = tmp_path / "node-1"
    gpus = FakeNvml("node-1", 2, control=control)
    control.write_text("1:thermal_throttle\n")
    assert gpus.poll_control() == 1
    assert gpus.poll_control() == 0
    with open(control, "a") as fh:
        fh.write("1:clear\n")
    assert gpus.poll_control() == 1
    assert gpus.sample(1)["throttle_reasons"] == []


def test_it_waits_for_a_whole_line_before_applying_it(tmp_path: Path) -> None:
    control = tmp_path / "node-1"
    gpus = FakeNvml("node-1", 2, control=control)
    control.write_text("1:thermal_thr")
    assert gpus.poll_control() == 0
    with open(control, "a") as fh:
        fh.write("ottle\n")
    assert gpus.poll_control() == 1
    assert "hw_thermal_slowdown" in gpus.sample(1)["throttle_reasons"]


def test_it_skips_a_bad_control_line_and_applies_the_rest(tmp_path: Path) -> None:
    control = tmp_path / "node-1"
    gpus = FakeNvml("node-1", 2, control=control)
    control.write_text("9:xid79\n1:melt\n0:thermal_throttle\n")
    assert gpus.poll_control() == 1
    assert "hw_thermal_slowdown" in gpus.sample(0)["throttle_reasons"]


def test_it_finds_its_control_file_from_the_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(CONTROL_ENV, str(tmp_path))
    gpus = FakeNvml("node-9", 1)
    (tmp_path / "node-9").write_text("0:thermal_throttle\n")
    assert gpus.poll_control() == 1


def test_it_keeps_spare_nodes_to_replace_a_failed_one() -> None:
    nodes = [f"node-{i:03d}" for i in range(1, 17)]
    slots, serve, spares = layout(nodes, 8)
    used = {s.node for group in slots.values() for s in group} | set(serve)
    assert len(slots["train-a"]) == 12 and len(slots["train-b"]) == 12
    assert spares and not used & set(spares)
    assert used | set(spares) == set(nodes)


def test_it_fails_a_spare_nodes_gpu_with_no_job_on_it(tmp_path: Path) -> None:
    """The demo's spare fault: a hardware Xid the fake NVML plays on a node that the default
    fleet keeps as a spare (no group placed there): the node incident alone is planned."""
    assert ("xid79", SPARE) in MATRIX
    kind = next(k for k, where in MATRIX if where == SPARE)
    _, _, spares = layout([f"node-{i:03d}" for i in range(1, 17)], 8)
    gpus = FakeNvml(spares[0], 2, control=tmp_path / spares[0])
    seen = _events(gpus)
    (tmp_path / spares[0]).write_text(f"0:{kind}\n")
    assert gpus.poll_control() == 1
    assert [(e["event"], e.get("code")) for e in seen][:1] == [("xid", 79)]


def test_it_reboots_a_node_with_clean_fake_hardware_a_new_boot_id_and_a_restart_request(
    tmp_path: Path,
) -> None:
    state, control, host, restart = (tmp_path / d for d in ("s", "nvml", "host", "restart"))
    for folder in (state, control, host, restart):
        folder.mkdir()
    (state / "agent.toml").write_text('scheduler = "slurm"\nboot_id = "node-1-boot-0"\n')
    (control / "node-1").write_text("3:xid79\n")
    (control / "node-2").write_text("0:thermal_throttle\n")
    (host / "node-1").write_text("link_down\n")
    plan = {"nodes": {"node-1": {"state": str(state), "udp": 1}}, "control": str(control),
            "host_control": str(host), "restart": str(restart)}  # fmt: skip
    fleet = Fleet(plan)
    assert fleet.reboot("node-1") == "node-1-boot-1"
    assert fleet.reboot("node-1") == "node-1-boot-2"
    config = tomllib.loads((state / "agent.toml").read_text())
    assert config == {"scheduler": "slurm", "boot_id": "node-1-boot-2"}
    assert not (control / "node-1").exists() and not (host / "node-1").exists()
    assert (control / "node-2").exists()  # other nodes keep their scripts
    assert [p.name for p in restart.iterdir()] == ["agent:node-1"]


def test_it_reads_whether_the_fake_scheduler_has_a_node_in_service(tmp_path: Path) -> None:
    scheduler = tmp_path / "scheduler"
    env = {**os.environ, **fake_slurm.install(scheduler)}
    fleet = Fleet({"nodes": {}, "control": str(tmp_path), "scheduler": str(scheduler)})
    assert fleet.in_service("node-1")  # unknown to the scheduler: idle
    drain = ["scontrol", "update", "nodename=node-1", "state=drain", "reason=faultline: 1 x"]
    subprocess.run(drain, env=env, check=True)
    assert not fleet.in_service("node-1")
    subprocess.run(["scontrol", "update", "nodename=node-1", "state=resume"], env=env, check=True)
    assert fleet.in_service("node-1")


def test_its_serving_workers_are_vllm_engines_their_nodes_agents_scrape(tmp_path: Path) -> None:
    nodes = [f"node-{i:03d}" for i in range(1, 4)]
    engines = serving_engines(nodes, 8)
    (serve_node,) = {e["node"] for e in engines.values()}
    config = tmp_path / "agent.toml"
    config.write_text(agent_toml(serve_node, 9999, engines))
    (tmp_path / "state").mkdir()
    plan = {"nodes": {serve_node: {"state": str(tmp_path), "udp": 9999}},
            "control": str(tmp_path), "restart": str(tmp_path), "engines": engines}  # fmt: skip
    fleet = Fleet(plan)
    fleet.reboot(serve_node)  # a reboot rewrites the boot id: the tables must stay tables
    cfg = build_config(_parser().parse_args(["run", "--config", str(config), "--dry-run"]))
    assert cfg.boot_id == f"{serve_node}-boot-1"
    assert sorted(c.worker for c in cfg.serving) == sorted(engines)
    group = ServingGroup("serve", fleet, random.Random(7))
    try:
        scrapers = {c.worker: EngineScraper(c) for c in cfg.serving}
        for s in scrapers.values():
            s.poll(0.0)
        group.tick(1.0)
        windows = {w: s.poll(5.0) for w, s in scrapers.items()}
        assert all(r and r["ready"] and r["kv_schema"] and r["window"]["requests"] > 60
                   and r["window"]["slo_met"] == r["window"]["requests"]
                   for r in windows.values()), windows  # fmt: skip
        fault = Fault("serving_not_ready")
        group.inject(fault)
        broken = scrapers[fault.worker or ""].poll(10.0)
        assert broken is not None and broken["ready"] and "kv_schema" not in broken
        group.recover()
        healed = scrapers[fault.worker or ""].poll(15.0)
        assert healed is not None and healed["kv_schema"] == "auto-b16"
    finally:
        group.close()


def _waits_for_two_people(svc: Service, log: Path, data: Path) -> None:
    """The on-call's quarantine waits on the approvals page for two approvers, with its
    evidence, gates and dry-run preview, and the terminal says how to approve it; it is
    still waiting after its incident resolved, and one vote does not carry it."""
    action = wait_for(
        lambda: next((a for a in svc.api("/api/v1/actions/")["results"]
                      if a["kind"] == "quarantine_node"), None),
        120, "the on-call's quarantine proposal",
    )  # fmt: skip
    assert action["state"] == "proposed" and action["approvals_required"] == 2, action
    assert action["proposed_by"] == "oncall" and action["incident"], action
    assert action["evidence"].get("node") == action["target"].split(":", 1)[1], action
    assert action["gate_reasons"] and action["preview"], action
    wait_for(lambda: "/approve/" in log.read_text(), 30, "the terminal's hint how to approve")
    text = log.read_text()
    assert f"action #{action['id']} (quarantine_node on {action['target']}" in text
    assert f"/api/v1/actions/{action['id']}/approve/" in text and "/approvals/" in text
    page = svc.login()[0]
    html = _get(svc, "/approvals/", page)
    assert f'data-action="{action["id"]}"' in html and "0 of 2 approvals" in html
    wait_for(
        lambda: svc.api(f"/api/v1/incidents/{action['incident']}/")["state"] == "resolved",
        120, "the throttled GPU's incident to resolve",
    )  # fmt: skip
    assert svc.api(f"/api/v1/actions/{action['id']}/")["state"] == "proposed"
    _post(svc, f"/api/v1/actions/{action['id']}/approve/")
    voted = svc.api(f"/api/v1/actions/{action['id']}/")
    assert voted["state"] == "proposed" and len(voted["votes"]) == 1, voted
    # The terminal: Faultline's own lines and the story's, never a child's output.
    lines = log.read_text().splitlines()
    assert all(x.startswith(("faultline: ", "demo: ")) for x in lines), [
        x for x in lines if not x.startswith(("faultline: ", "demo: "))
    ][:5]
    first = "faultline: demo starting; the service's, agents' and workload's logs go to"
    assert lines[0] == f"{first} {data / 'logs'}/"
    assert any(x.startswith("faultline: incident #") and "/incidents/" in x for x in lines)
    assert {p.name for p in (data / "logs").iterdir()} >= {"web.log", "worker.log", "workload.log"}


def _get(svc: Service, path: str, cookie: str) -> str:
    request = urllib.request.Request(svc.url + path, headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def _post(svc: Service, path: str) -> dict:
    basic = base64.b64encode(f"{ADMIN[0]}:{ADMIN[1]}".encode()).decode()
    request = urllib.request.Request(
        svc.url + path, data=b'{"reason": "checked"}', method="POST",
        headers={"Authorization": f"Basic {basic}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True)
    children: dict[int, list[int]] = {}
    for line in out.stdout.splitlines():
        child, parent = (int(x) for x in line.split())
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.slow
def test_it_plays_a_fleet_whose_faults_open_incidents_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    ws_port = free_port(avoid=frozenset({port}))
    log = tmp_path / "demo.log"
    proc = subprocess.Popen(
        [str(BIN / "faultline"), "demo", "--nodes", "3", "--gpus", "8", "--schedule", "fast",
         "--port", str(port), "--ws-port", str(ws_port), "--data-dir", str(tmp_path)],
        env=service_env(tmp_path), stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True,
    )  # fmt: skip
    svc = Service(f"http://127.0.0.1:{port}", port, ws_port, tmp_path, proc, log)
    try:
        wait_for(lambda: len(svc.api("/api/v1/nodes/")["results"]) == 3, 90, "3 demo nodes")
        wait_for(lambda: svc.api("/api/v1/devices/")["count"] == 24, 30, "24 fake GPUs")
        groups = wait_for(
            lambda: {g["name"] for g in svc.api("/api/v1/groups/")["results"]} >= {
                "train-a", "train-b", "serve"
            },
            30,
            "the demo's three groups",
        )  # fmt: skip
        assert groups
        # The simulated trainers report their FLOPs and the fake GPUs a named peak: the
        # console shows their MFU and HFU (a 7B-class model with recomputation: ~44 %, ~59 %).
        use = wait_for(
            lambda: (
                (svc.api("/api/v1/groups/train-b/").get("utilisation") or {}).get("mfu")
                and svc.api("/api/v1/groups/train-b/")["utilisation"]
            ),
            60,
            "MFU on a demo training group",
        )
        assert 0.1 < use["mfu"] < 0.6 and use["hfu"] == pytest.approx(use["mfu"] * 4 / 3, 0.01)
        assert use["per_rank"][0]["device"] == "Faultline Fake H100 80GB HBM3"
        opened = wait_for(
            lambda: [i for i in svc.api("/api/v1/incidents/")["results"] if i["group"]],
            90,
            "a scheduled fault to open an incident",
        )
        assert {i["group"] for i in opened} <= {"train-a", "train-b", "serve"}

        # The reliability record fills: a group that recovered through a new generation
        # is an interruption with its measured costs, on the page and in its REST.
        def measured() -> dict | None:
            r = svc.api("/api/v1/reliability/?days=1")
            done = [i for i in r["incidents"] if i["downtime_s"] is not None]
            return r if done else None

        record = wait_for(measured, 150, "the reliability record to show a demo recovery")
        first = next(i for i in record["incidents"] if i["downtime_s"] is not None)
        assert first["group"] in ("train-a", "train-b") and first["downtime_s"] > 0
        assert record["by_layer"] and record["mttr_s"] is not None
        page = svc.api(f"/api/v1/incidents/{first['incident']}/")
        assert page["costs"]["restarted"] is True and page["costs"]["restore_s"] is not None
        # The loop: the first fault is an Xid 79; the demo policy auto-approves draining
        # its node inside the blast radius and the agent's Slurm backend drains it on the
        # demo's fake scheduler.
        drained = wait_for(
            lambda: [
                a for a in svc.api("/api/v1/actions/?state=succeeded")["results"]
                if a["kind"] == "drain_node" and a["proposed_by_rule"] == "policy"
            ],
            120,
            "the policy's drain_node to succeed on the agent",
        )  # fmt: skip
        node = drained[0]["target"].split(":", 1)[1]
        # Drained with Faultline's reason, read from the fake scheduler's call log: on a
        # loaded machine the demo's repair may already have resumed the node by now.
        calls = [
            json.loads(line)
            for line in (tmp_path / "demo" / "scheduler" / "calls.jsonl").read_text().splitlines()
        ]
        drains = [
            c for c in calls
            if c[:2] == ["scontrol", "update"] and f"nodename={node}" in c and "state=drain" in c
        ]  # fmt: skip
        assert drains, calls[-20:]
        reason = next(a for a in drains[0] if a.startswith("reason="))
        assert reason.startswith(f"reason=faultline: {drained[0]['id']} "), reason
        # The return: the node stays out until the demo repairs (reboots) it; the service
        # validates it (10 s in the demo), the sweep proposes uncordon_node, the demo policy
        # auto-approves it and the agent resumes the node on the fake scheduler.
        assert svc.api(f"/api/v1/nodes/{node}/")["lifecycle"] in ("out_of_service", "validating")
        back = wait_for(
            lambda: [
                a for a in svc.api("/api/v1/actions/?state=succeeded")["results"]
                if a["kind"] == "uncordon_node" and a["target"] == f"node:{node}"
            ],
            150,
            f"{node} to be returned to service after its repair",
        )  # fmt: skip
        assert back[0]["proposed_by_rule"] == "fleet_health" and back[0]["trigger"] == "validated"
        assert back[0]["outcome"]["state"] == "applied", back[0]["outcome"]
        state = json.loads((tmp_path / "demo" / "scheduler" / "state.json").read_text())
        assert state["nodes"][node] == {"state": "IDLE", "reason": ""}
        shown = svc.api(f"/api/v1/nodes/{node}/")
        assert shown["lifecycle"] == "healthy", shown["lifecycle_reason"]
        kinds = [e["kind"] for e in reversed(shown["history"]) if not e["gpu"]]
        assert kinds.index("repair") < kinds.index("returned"), kinds
        wait_for(lambda: f"{node} back in service" in log.read_text(), 10, "the demo's word")
        text = log.read_text()
        assert f"{node} repaired: rebooted" in text
        assert f"faultline: agent:{node} restarted on request" in text
        assert f"first admin login: {ADMIN[0]} (password from FAULTLINE_ADMIN_PASSWORD)" in text
        assert ADMIN[1] not in text  # a log file never holds the admin password
        # The demo's own workload breaks no contract: its job starts and restarts are
        # announced by nodes that host (or just placed) the group's ranks.
        every = svc.api("/api/v1/incidents/?limit=200")["results"]
        refused = [i["summary"] for i in every if i["kind"] in ("unauthorized_transition",
                   "rank_claim", "generation_jump", "device_claim")]  # fmt: skip
        assert refused == [], refused
        # The Xid's incident is about one rank: its page shows the step that rank stopped
        # in, end to end: its peers entered that step's all_reduce (joined by step_id),
        # the rank on the dead GPU never did.
        xid = min((i for i in every if i["kind"] == "xid" and i["group"] == "train-a"),
                  key=lambda i: i["id"])  # the first: the fault the demo injected  # fmt: skip
        trace = svc.api(f"/api/v1/pages/incidents/{xid['id']}/")["trace"]
        assert trace["kind"] == "rank", trace
        assert trace["step_id"] == f"g{xid['generation']}:s{trace['step']}", trace
        culprit = next(r for r in trace["ranks"] if r["culprit"])
        assert culprit["calls"] == [] and culprit["committed"] is False, trace
        calls = [c for r in trace["ranks"] if not r["culprit"] for c in r["calls"]]
        assert calls and {c["state"] for c in calls} == {"started"}, trace
        _waits_for_two_people(svc, log, tmp_path)
        children = _descendants(proc.pid)
        assert len(children) >= 3 + 5  # agents, workload, web, ws, worker, beat
    finally:
        stopping = datetime.now().astimezone()  # the agents' log lines carry local time
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert code == 0
    text = log.read_text()
    # Ctrl-C: the simulated fleet stops before the service it reports to, quietly.
    assert text.rstrip().endswith("faultline: demo stopped"), text[-2000:]
    tail = text[text.index("faultline: stopping the simulated fleet, then the service") :]
    assert "Traceback" not in tail and "unreachable" not in tail, tail
    # From the stop on (a batch that timed out once on a loaded machine while the demo ran
    # is retried, and says so: not what this checks).
    agent_lines = [line for p in (tmp_path / "logs").glob("agent-*.log")
                   for line in p.read_text().splitlines()]  # fmt: skip
    assert not [line for line in agent_lines
                if "unreachable" in line and _logged_at(line) >= stopping]  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in children):
        time.sleep(0.2)
    assert [p for p in children if _alive(p)] == []
    assert not (tmp_path / "pg" / "postmaster.pid").exists()


def _logged_at(line: str) -> datetime:
    """A log line's time (`2026-12-07 06:43:55,763 ...`); a line without one (a traceback's)
    counts as at the stop, so it is never overlooked."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").astimezone()
    except ValueError:
        return datetime.max.replace(tzinfo=UTC)
