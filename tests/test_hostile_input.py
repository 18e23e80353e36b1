"""Hostile input loses nothing and stops nobody: a run whose fields are wrong lands with them null and counted in
``anomalies``; whatever goes wrong in one project's pages is that project's failure alone.

Finding 4 (a count of ``"²"`` or above 2^31, a lone surrogate in the metadata file) and finding 12 (a malformed
page) of code-review-2026-11c, and the properties issue 32 asks for: total normalisation, and a project's
failure staying its own."""

import json
import math
from datetime import datetime
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import API_KEY
from wandb_assets.lib.accounting.gpus import MAX_GPUS, whole_count
from wandb_assets.lib.fetch import FetchPolicy, Slice, created_between, fetch_slices, get_api
from wandb_assets.lib.normalize import run_row
from wandb_assets.lib.warehouse import ensure_schema, load_runs_window, stage_rows
from wandb_assets.localwandb import LocalWandbServer, make_run_node
from wandb_assets.settings import WandbSettings


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (8, 8),
        ("8", 8),
        (" 4 ", 4),
        (2.0, 2),
        (MAX_GPUS, MAX_GPUS),
        (MAX_GPUS + 1, None),
        (8_000_000_000, None),
        (2**31, None),
        ("²", None),  # str.isdigit() says yes, int() says no
        ("\u0663", None),  # ARABIC-INDIC DIGIT THREE: int() takes it, a count is ASCII
        ("9" * 40, None),
        (2.5, None),
        (math.nan, None),
        (math.inf, None),
        (True, None),
        (0, None),
        (-3, None),
        ([8], None),
    ],
)
def test_a_gpu_count_is_ascii_digits_or_a_whole_number_from_1_to_max_gpus(value, expected):
    assert whole_count(value, 1, MAX_GPUS) == expected


def _node(run_id: str, config: dict | None = None, **fields) -> dict:
    node = {
        "name": run_id,
        "displayName": run_id,
        "state": "finished",
        "createdAt": "2026-06-01T10:00:00Z",
        "heartbeatAt": "2026-06-01T11:00:00Z",
        "config": json.dumps(config or {}),
        "summaryMetrics": "{}",
    }
    return node | fields


def _row(node, metadata=None) -> dict:
    return run_row(node, entity="e", project="p", app_url="https://wandb.ai", default_gpus=1, metadata=metadata)


def test_runs_with_bad_counts_or_a_metadata_surrogate_land_beside_the_others_with_the_bad_fields_counted(
    memory_con, tmp_path
):
    rows = [
        _row(_node("good", {"compute": {"gpu_count": 2}})),
        _row(_node("superscript", {"compute": {"gpu_count": "²", "cpu_count": "³"}})),
        _row(_node("huge", {"compute": {"gpu_count": 8_000_000_000, "cpu_count": 2**40}})),
        _row(_node("meta"), {"status": "read", "gpu_count": "\u00b9", "gpu": "Tesla \udce9"}),
        _row(_node("gpu-index", systemMetrics=json.dumps({"system.gpu.99999999999.gpu": 3.0}))),
    ]
    path, written = stage_rows(rows, str(tmp_path))
    ensure_schema(memory_con)
    assert load_runs_window(memory_con, path, datetime(2026, 6, 1), datetime(2026, 6, 2)) == 5
    got = memory_con.execute(
        "SELECT run_id, gpu_count, gpu_count_source, cpu_count, gpu_model, anomalies, wandb_metadata->>'gpu' "
        "FROM runs ORDER BY run_id"
    ).fetchall()
    assert got == [
        ("good", 2, "config", None, None, [], None),
        ("gpu-index", 1, "default", None, None, [], None),
        ("huge", 1, "default", None, None, ["gpu_count", "cpu_count"], None),
        ("meta", 1, "default", None, "Tesla \ufffd", ["metadata_gpu_count", "text_encoding"], "Tesla \ufffd"),
        ("superscript", 1, "default", None, None, ["gpu_count", "cpu_count"], None),
    ]


def test_a_node_that_is_not_even_an_object_is_kept_by_its_id_or_counted(tmp_path):
    from wandb_assets.lib.staging import Page, RowRules, StagedFetch, stage_page

    staged = StagedFetch(tmp_path)
    nodes = [_node("ok"), _node("bad-user", user="alice"), {"name": 17, "tags": "x"}, {"displayName": "no id"}, []]
    page = Page(0, 1, ["2026-06-01"], "e", "p", nodes, [None] * len(nodes), datetime(2026, 6, 1, 12))
    tally = stage_page(staged, page, RowRules("https://wandb.ai", 1, ("compute.gpu_count",)))
    assert sorted(tally.malformed) == ["(no id)", "(no id)", "17"]
    assert tally.anomalies == {"run_id": 2, "created_at": 1}
    written = [
        json.loads(line) for part in sorted(staged.work.glob("part-*")) for line in part.read_text().splitlines()
    ]
    assert sorted((r["run_id"], r["user"], r["anomalies"]) for r in written) == [
        ("17", None, ["created_at"]),
        ("bad-user", None, []),
        ("ok", None, []),
    ]


# ----------------------------------------------------------------------------------- total normalisation

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=12)
    | st.sampled_from(["²", "\u0663", "\udce9", "NaN", "-1", "8", "9" * 30, "2026-06-01T10:00:00Z"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
_known_keys = st.sampled_from(
    [
        "name",
        "displayName",
        "state",
        "createdAt",
        "heartbeatAt",
        "config",
        "summaryMetrics",
        "systemMetrics",
        "tags",
        "user",
        "sweepName",
        "group",
        "jobType",
    ]
)
_config_like = st.dictionaries(
    st.sampled_from(["compute", "compute.gpu_count", "compute.cpu_count", "compute.gpu_type", "slurm", "_wandb"]),
    _json,
    max_size=4,
)


def _encoded(value):
    """Sometimes as W&B sends it (JSON text, once or twice encoded), sometimes as an object, sometimes anything."""
    return st.one_of(
        st.just(value), st.just(json.dumps(value, default=str)), st.just(json.dumps(json.dumps(value, default=str)))
    )


_nodes = st.lists(
    st.one_of(
        st.dictionaries(_known_keys, _json, max_size=8),
        st.fixed_dictionaries(
            {"name": st.text(min_size=1, max_size=8), "createdAt": st.just("2026-06-01T10:00:00Z")},
            optional={
                "config": _config_like.flatmap(_encoded),
                "summaryMetrics": st.dictionaries(st.text(max_size=8), _json, max_size=4).flatmap(_encoded),
                "systemMetrics": st.dictionaries(
                    st.sampled_from(
                        ["system.gpu.0.gpu", "system.gpu.1.gpu", "system.gpu.٣.gpu", "system.gpu.7.memory"]
                    ),
                    _json,
                    max_size=3,
                ).flatmap(_encoded),
                "state": _json,
                "tags": _json,
                "user": _json,
            },
        ),
        _json,
    ),
    max_size=6,
)
_metadata = st.one_of(
    st.none(), _json, st.fixed_dictionaries({"status": st.just("read")}, optional={"gpu_count": _json, "gpu": _json})
)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(nodes=_nodes, metadata=st.lists(_metadata, min_size=6, max_size=6))
def test_any_json_as_run_nodes_and_metadata_normalises_and_loads_and_every_run_with_an_id_lands(
    nodes, metadata, tmp_path
):
    rows = [_row(node, meta) for node, meta in zip(nodes, metadata, strict=False)]
    keep = [row for row in rows if row["run_id"] is not None]
    path, _ = stage_rows(keep, str(tmp_path))
    con = _empty_warehouse()
    loaded = load_runs_window(con, path, datetime(2000, 1, 1), datetime(2100, 1, 1))
    assert loaded == len({row["run_id"] for row in keep})
    for row in keep:
        assert isinstance(row["anomalies"], list)


_WAREHOUSE = []


def _empty_warehouse():
    """One in-memory warehouse for every example of the property tests here, its runs emptied before each (a schema
    costs 0.17 s to make: 20 of the first test's 35 s when each example made its own)."""
    import duckdb

    if not _WAREHOUSE:
        _WAREHOUSE.append(duckdb.connect())
        ensure_schema(_WAREHOUSE[0])
    _WAREHOUSE[0].execute("DELETE FROM runs")
    return _WAREHOUSE[0]


# ------------------------------------------------------------------ a project's failure stays its own


class _Broken(Exception):
    pass


@pytest.mark.parametrize("where", ["handle_page", "enrich"])
@pytest.mark.parametrize(
    "error", [KeyError("node"), ValueError("²"), UnicodeEncodeError("utf-8", "\udce9", 0, 1, "x"), _Broken("?")]
)
def test_whatever_one_projects_pages_raise_only_that_project_is_abandoned_with_the_reason(
    where, error, monkeypatch, tmp_path
):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    created = datetime(2026, 6, 1, 10)
    server = LocalWandbServer(
        [make_run_node(f"a{n}", display_name=f"a{n}", state="finished", created_at=created) for n in range(3)],
        entity="t",
        project="a",
        api_key=API_KEY,
    ).start()
    try:
        b_runs = [make_run_node(f"b{n}", display_name=f"b{n}", state="finished", created_at=created) for n in range(4)]
        server.add_project("t", "b", b_runs)
        api = get_api(
            WandbSettings(api_key=API_KEY, project="a", entity="t", base_url=server.url),
            SimpleNamespace(http_timeout_s=5.0, http_retries=1, retry_wait_max_s=0.5),
        )
        window = created_between(datetime(2026, 6, 1), datetime(2026, 6, 2))
        slices = [Slice(0, window, "2026-06-01", "t/a"), Slice(1, window, "2026-06-01", "t/b")]
        got: dict[str, list[str]] = {}

        def step(piece: Slice, nodes: list[dict]) -> None:
            if piece.project == "t/a":
                raise error

        def handle(piece: Slice, nodes: list[dict]) -> None:
            if where == "handle_page":
                step(piece, nodes)
            got.setdefault(piece.project, []).extend(node["name"] for node in nodes)

        enrich = (lambda piece, nodes: step(piece, nodes)) if where == "enrich" else None
        policy = FetchPolicy(concurrency=2, page_size=2, min_page_size=1, retries=0, retry_wait_max_s=0.1)
        stats = fetch_slices(
            api, "t", "a", slices, policy, handle, isolate_projects=True, enrich=enrich, secret=API_KEY
        )
        assert got == {"t/b": ["b0", "b1", "b2", "b3"]}
        assert list(stats.failed_projects) == ["t/a"]
        assert type(error).__name__ in stats.failed_projects["t/a"]
    finally:
        server.stop()


def test_a_malformed_page_fails_its_project_with_a_sentence_and_not_the_others():
    class Service:
        def execute_graphql(self, query, variables, parse=None):  # the client's signature; the page given parsed
            node = _node(variables["project"] + "-run")
            edges = [{"cursor": "c1"} if variables["project"] == "a" else {"node": node, "cursor": "c1"}]
            return {"project": {"runCount": 1, "runs": {"edges": edges, "pageInfo": {"hasNextPage": False}}}}

    window = created_between(datetime(2026, 6, 1), datetime(2026, 6, 2))
    slices = [Slice(0, window, "2026-06-01", "t/a"), Slice(1, window, "2026-06-01", "t/b")]
    got = []
    stats = fetch_slices(
        SimpleNamespace(_service_api=Service()),
        "t",
        "a",
        slices,
        FetchPolicy(concurrency=1),
        lambda piece, nodes: got.extend(n["name"] for n in nodes),
        isolate_projects=True,
    )
    assert got == ["b-run"]
    assert stats.failed_projects["t/a"].startswith("W&B sent a malformed page of t/a ")


_texts = st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=10)
_moments = st.none() | st.datetimes(min_value=datetime(1971, 1, 2), max_value=datetime(2200, 1, 1))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    runs=st.lists(
        st.builds(
            lambda run_id, name, tags, config, summary, created, last, exit_code, stats, project: {
                "run_id": run_id,
                "display_name": name,
                "tags": tags,
                "config": config,
                "summary": summary,
                "created_at": created,
                "last_record_at": last,
                "exit_code": exit_code,
                "gpu_stats": stats,
                "project": project,
            },
            st.text(min_size=1, max_size=6),
            _texts,
            st.lists(_texts, max_size=3),
            st.dictionaries(st.text(max_size=6), _json, max_size=4),
            st.dictionaries(st.text(max_size=6), _json, max_size=4),
            _moments,
            _moments,
            st.none() | st.integers(min_value=-(2**40), max_value=2**40),
            st.lists(
                st.tuples(
                    st.floats(min_value=0, max_value=4e9),
                    st.dictionaries(
                        st.sampled_from(["system.gpu.0.gpu", "system.gpu.1.gpu", "system.gpu.9999.gpu"]), _json
                    ),
                ),
                max_size=3,
            ),
            st.sampled_from(["p", "q"]),
        ),
        max_size=4,
    ),
)
def test_any_offline_record_normalises_and_loads_and_every_run_lands(runs, tmp_path):
    """Total normalisation, offline: what a log's records decode to (any unicode, huge and negative numbers, wrong
    types in config and summary and system stats) becomes a row the load takes, one per (entity, project, run)."""
    from datetime import timedelta

    from wandb_assets.lib.offline_runs import OfflineRun, offline_node
    from wandb_assets.lib.warehouse import load_offline_runs

    rows = {}
    for fields in runs:
        run = OfflineRun(path=f"/logs/{fields['project']}/run.wandb", entity="e", **fields)
        row = run_row(
            offline_node(run, datetime(2030, 1, 1), timedelta(hours=1)),
            entity="e",
            project=run.project,
            app_url="",
            default_gpus=1,
        )
        row.update(url=None, source="offline", log_path=run.path)
        rows[(row["entity"], row["project"], row["run_id"])] = row
    path, _ = stage_rows(list(rows.values()), str(tmp_path))
    con = _empty_warehouse()
    counts = load_offline_runs(con, path, [], datetime(2030, 1, 1))
    assert counts["loaded"] == len(rows) == con.execute("SELECT count(*) FROM runs").fetchone()[0]
