"""Fleet, group and incident pages with their JSON twins: content, filters, query counts."""

from __future__ import annotations

import pytest

from console.models import ConsistencyGroup, Node
from tests.server.pages.conftest import RANKS, SLOW_RANK

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer_client(client, cast):
    client.force_login(cast["viewer"])
    return client


def test_it_sends_anonymous_visitors_to_login(client):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_it_lists_the_open_incident_above_the_groups_on_the_fleet_page(
    viewer_client, training_group
):
    html = viewer_client.get("/").content.decode()
    assert f'data-incident="{training_group["incident"].pk}"' in html
    assert html.index('id="incident-rows"') < html.index('id="group-rows"')
    assert 'data-group="llm-pages"' in html


def test_it_colours_a_node_by_its_worst_gpu_and_marks_quarantine(viewer_client, training_group):
    node = Node.objects.get(name="node-p1")
    node.devices.filter(index=3).update(health="critical")
    Node.objects.filter(pk=node.pk).update(quarantined=True)
    html = viewer_client.get("/").content.decode()
    assert 'class="node health-critical quarantined"' in html
    assert "flag-quarantined" in html


def test_it_filters_groups_by_state(viewer_client, training_group):
    ConsistencyGroup.objects.create(name="other", state="recovering")
    data = viewer_client.get("/api/v1/pages/fleet/?state=recovering").json()
    assert [g["name"] for g in data["groups"]] == ["other"]


def test_it_filters_nodes_and_groups_by_label(viewer_client, training_group):
    Node.objects.create(name="node-h100", labels={"pool": "h100"})
    ConsistencyGroup.objects.filter(name="llm-pages").update(labels={"pool": "h100"})
    data = viewer_client.get("/api/v1/pages/fleet/?label=pool=h100").json()
    assert [n["name"] for n in data["nodes"]] == ["node-h100"]
    assert [g["name"] for g in data["groups"]] == ["llm-pages"]


def test_it_renders_the_fleet_page_in_a_fixed_number_of_queries(
    viewer_client, training_group, django_assert_max_num_queries
):
    for i in range(20):
        ConsistencyGroup.objects.create(name=f"g{i}")
        Node.objects.create(name=f"extra-{i}")
    with django_assert_max_num_queries(7):
        assert viewer_client.get("/").status_code == 200


def test_it_shows_advice_checkpoint_and_state_on_the_group_page(viewer_client, training_group):
    html = viewer_client.get("/groups/llm-pages/").content.decode()
    assert "Automatic restart is NOT safe" in html  # NaN loss blocks auto-restart
    assert "ckpt-2" in html
    assert 'class="state state-running"' in html


def test_it_renders_the_group_page_in_a_fixed_number_of_queries(
    viewer_client, training_group, django_assert_max_num_queries
):
    # 7 + 4 for the recovery objectives and their advice (nodes, checkpoints,
    # transitions, failures), none of which grows with the group.
    with django_assert_max_num_queries(11):
        assert viewer_client.get("/groups/llm-pages/").status_code == 200


def test_it_answers_404_for_an_unknown_group(viewer_client, training_group):
    assert viewer_client.get("/groups/nope/").status_code == 404


def test_it_bins_the_heatmap_per_rank_and_keeps_the_slow_rank_visible(
    viewer_client, training_group
):
    charts = viewer_client.get("/api/v1/pages/groups/llm-pages/charts/").json()
    z = charts["heatmap"]["z"]
    assert len(z) == RANKS
    assert max(v for v in z[SLOW_RANK] if v is not None) == 1600.0
    assert max(v for v in z[0] if v is not None) == 1000.0


def test_it_reports_the_slowest_rank_first_with_its_phases(viewer_client, training_group):
    slowest = viewer_client.get("/api/v1/pages/groups/llm-pages/charts/").json()["slowest"]
    first = slowest["ranks"].index(f"r{SLOW_RANK}")
    assert slowest["ranks"][first - 1] in ("median", None) or first == 0
    assert slowest["phases"]["compute"][first] == 1300.0


def test_it_computes_a_tail_ratio_above_one_with_a_straggler(viewer_client, training_group):
    series = viewer_client.get("/api/v1/pages/groups/llm-pages/charts/").json()["percentiles"]
    assert max(r for r in series["rho"] if r is not None) > 1.4


def test_it_computes_the_charts_in_a_fixed_number_of_queries(
    viewer_client, training_group, django_assert_max_num_queries
):
    with django_assert_max_num_queries(13):
        assert viewer_client.get("/api/v1/pages/groups/llm-pages/charts/").status_code == 200


def test_it_answers_empty_charts_for_a_group_without_steps(viewer_client, training_group):
    ConsistencyGroup.objects.create(name="quiet", kind="training")
    charts = viewer_client.get("/api/v1/pages/groups/quiet/charts/").json()
    assert charts["heatmap"] is None


def test_it_refuses_the_page_json_to_anonymous_callers(client, training_group):
    assert client.get("/api/v1/pages/groups/llm-pages/").status_code in (401, 403)


def test_it_shows_a_serving_group_as_a_worker_table(viewer_client, post_batch):
    from tests.conftest import make_batch

    post_batch(
        make_batch(
            [{"kind": "serving", "group": "chat", "worker": "w-1", "model_version": "m1",
              "ready": True, "draining": False,
              "window": {"seconds": 10, "requests": 50, "slo_met": 49}}],
            node="node-s",
        )
    )  # fmt: skip
    html = viewer_client.get("/groups/chat/").content.decode()
    assert 'id="worker-rows"' in html and "w-1" in html
    assert 'id="chart-heatmap"' not in html


def test_it_draws_healthy_nodes_as_compact_tiles_in_a_big_fleet(viewer_client, training_group):
    from console.api.pages import COMPACT_ABOVE

    Node.objects.bulk_create(
        [Node(name=f"big-{i:04d}", health="ok") for i in range(COMPACT_ABOVE + 1)]
    )
    Node.objects.filter(name="node-p1").first().devices.filter(index=2).update(health="critical")
    html = viewer_client.get("/").content.decode()
    assert 'class="node compact health-ok" data-node="big-0000"' in html
    assert 'class="node health-critical" data-node="node-p1"' in html
    assert html.count('data-gpu="GPU-p-') == RANKS  # the broken node keeps its GPU cells


def _big_fleet(gpus_each: int = 2) -> None:
    """More nodes than COMPACT_ABOVE, all healthy, `gpus_each` ok GPUs on the first one."""
    from console.api.pages import COMPACT_ABOVE
    from console.models import Device

    Node.objects.bulk_create(
        [Node(name=f"big-{i:04d}", health="ok") for i in range(COMPACT_ABOVE + 1)]
    )
    first = Node.objects.get(name="big-0000")
    Device.objects.bulk_create(
        [Device(uuid=f"GPU-big-{i}", node=first, index=i, health="ok") for i in range(gpus_each)]
    )


def test_it_sends_a_big_fleets_healthy_nodes_as_tiles_without_their_gpus(
    viewer_client, training_group
):
    """A tile shows no GPU, so the page's JSON (every open fleet page refetches
    it) carries a tile's GPU count, not 8 GPU dicts; a sick node keeps its whole card."""
    from console.models import Device

    _big_fleet(gpus_each=2)
    Device.objects.filter(uuid="GPU-p-2").update(health="critical")
    data = viewer_client.get("/api/v1/pages/fleet/").json()
    nodes = {n["name"]: n for n in data["nodes"]}
    assert data["compact"] is True
    assert nodes["big-0000"] == {"name": "big-0000", "gpus": 2, "worst": "ok", "compact": True}
    assert nodes["big-0001"]["gpus"] == 0 and "devices" not in nodes["big-0001"]
    sick = nodes["node-p1"]
    assert sick["compact"] is False and sick["worst"] == "critical" and sick["gpus"] == RANKS
    assert [d["uuid"] for d in sick["devices"]] == [f"GPU-p-{i}" for i in range(RANKS)]
    assert data["gpu_total"] == RANKS + 2 == Device.objects.count()
    assert data["node_counts"]["ok"] == len(nodes) - 1 and data["node_counts"]["critical"] == 1
    html = viewer_client.get("/").content.decode()
    assert 'data-node="big-0000" data-gpus="2" title="big-0000 · 2 GPUs ok"' in html
    assert f'id="kpi-gpus" data-total="{RANKS + 2}"' in html


@pytest.mark.parametrize(
    "sickness",
    [{"health": "warning"}, {"quarantined": True}, {"cordoned": True},
     {"lifecycle": "faulted", "lifecycle_reason": "Xid 79"}],
)  # fmt: skip
def test_it_never_shrinks_a_sick_or_marked_node_to_a_tile(viewer_client, training_group, sickness):
    _big_fleet()
    Node.objects.filter(name="node-p1").update(**sickness)
    nodes = {n["name"]: n for n in viewer_client.get("/api/v1/pages/fleet/").json()["nodes"]}
    assert nodes["node-p1"]["compact"] is False and len(nodes["node-p1"]["devices"]) == RANKS
    assert nodes["big-0000"]["compact"] is True


def test_it_keeps_every_gpu_of_a_small_fleet(viewer_client, training_group):
    data = viewer_client.get("/api/v1/pages/fleet/").json()
    (node,) = data["nodes"]
    assert data["compact"] is False and node["compact"] is False and node["worst"] == "ok"
    assert len(node["devices"]) == node["gpus"] == data["gpu_total"] == RANKS


def test_it_escapes_what_a_node_card_shows(viewer_client, training_group):
    from datetime import UTC, datetime

    Node.objects.filter(name="node-p1").update(
        lifecycle="out_of_service", lifecycle_reason='<script>alert("x")</script>',
        lifecycle_since=datetime(2026, 11, 29, tzinfo=UTC), taken_out_by="<b>ops</b>",
        replace_flagged=True,
    )  # fmt: skip
    html = viewer_client.get("/").content.decode()
    assert "<script>alert" not in html and "<b>ops</b>" not in html
    assert 'title="&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; · out by &lt;b&gt;ops' in html
    assert (
        '<time class="since" datetime="2026-11-29T00:00:00+00:00" title="2026-11-29 00:00:00 UTC">'
        in html
    )
    assert '<span class="flag flag-replace">replace</span>' in html
    assert '<a href="/nodes/node-p1/">node-p1</a>' in html


def test_it_counts_a_group_without_ranks_or_incidents_as_zero(viewer_client, training_group):
    ConsistencyGroup.objects.create(name="empty")
    row = next(g for g in viewer_client.get("/api/v1/pages/fleet/").json()["groups"]
               if g["name"] == "empty")  # fmt: skip
    assert row["ranks"] == 0 and row["open_incidents"] == 0


def test_it_counts_each_open_incident_once_however_many_ranks(viewer_client, training_group):
    data = viewer_client.get("/api/v1/pages/fleet/").json()
    row = next(g for g in data["groups"] if g["name"] == "llm-pages")
    expected = training_group["incident"].group.incidents.exclude(state="resolved").count()
    assert row["ranks"] == RANKS and row["open_incidents"] == expected


@pytest.mark.parametrize(
    "url",
    ["/groups/a%00/", "/api/v1/pages/groups/a%00/", "/api/v1/pages/fleet/?label=pool%3Da%00"],
)
def test_it_refuses_nul_in_a_page_path_or_filter(viewer_client, url):
    """Found by the schema fuzz: each was a 500 (Postgres cannot compare text with NUL)."""
    response = viewer_client.get(url)
    assert response.status_code == 400
    assert "NUL" in response.json()["error"]
