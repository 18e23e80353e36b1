"""Which projects a deployment mirrors: ``WANDB_ASSETS_PROJECTS`` parsed and resolved (pure functions)."""

import pytest

from wandb_assets.lib.errors import ConfigError
from wandb_assets.lib.projects import ProjectRef, ProjectSelection, parse_projects


def test_items_named_projects_and_whole_entities_in_order_each_once():
    selection = parse_projects(" research/llm-pretrain, ci/* ,research/vision,ci/*, research/llm-pretrain,")
    assert selection == ProjectSelection(
        projects=(ProjectRef("research", "llm-pretrain"), ProjectRef("research", "vision")),
        whole_entities=("ci",),
    )
    assert selection.entities == ("ci", "research")
    assert str(selection.projects[0]) == "research/llm-pretrain"


def test_resolve_adds_every_listed_project_of_a_whole_entity_and_keeps_named_ones_when_a_listing_failed():
    selection = parse_projects("research/llm, ci/*, lab/*, lab/named")
    listed = {"ci": ["bench", "smoke", "bench"], "research": ["llm", "other"]}  # lab's listing failed
    assert selection.resolve(listed) == [
        ProjectRef("ci", "bench"),
        ProjectRef("ci", "smoke"),
        ProjectRef("lab", "named"),
        ProjectRef("research", "llm"),  # named: "other" is not mirrored, research is not a whole entity
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "set but empty"),
        (" , ", "set but empty"),
        ("research", "'research': each item is entity/project or entity/*"),
        ("research/", "the project may not be empty"),
        ("/llm", "the entity may not be empty"),
        ("research/llm/extra", "'research/llm/extra'"),
        ("research/my project", "contain spaces"),
        ("re:search/llm", "'re:search/llm'"),
    ],
)
def test_a_malformed_item_is_one_sentence_naming_it(text, says):
    with pytest.raises(ConfigError) as caught:
        parse_projects(text)
    message = str(caught.value)
    assert says in message
    assert message.count(". ") == 0 and message.endswith(".")  # one sentence


# ------------------------------------------------------------- the local server: several entities and projects


def _nodes(prefix: str, count: int, display: str) -> list[dict]:
    from datetime import datetime

    from wandb_assets.localwandb import make_run_node

    return [
        make_run_node(
            f"{prefix}{n}", display_name=f"{display}-{n}", state="finished", created_at=datetime(2026, 6, 1, n)
        )
        for n in range(count)
    ]


def _status(url: str, path: str) -> int:
    """The HTTP status of one ``Runs`` request for ``path`` (the wandb client would retry it for minutes)."""
    import base64
    import json
    import urllib.error
    import urllib.request

    from tests.conftest import API_KEY

    entity, project = path.split("/")
    body = {"query": "query Runs($project: String!, $entity: String!) { project { runCount } }"}
    body["variables"] = {"entity": entity, "project": project, "perPage": 1}
    auth = "Basic " + base64.b64encode(f"api:{API_KEY}".encode()).decode()
    request = urllib.request.Request(f"{url}/graphql", json.dumps(body).encode(), {"Authorization": auth})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_local_server_lists_and_serves_several_entities_to_the_real_client(monkeypatch, tmp_path):
    """What the wandb 0.31 client sends to list an entity's projects (``GetProjects``, paged) and read each
    one's runs; the same run id in two projects is two runs; one project failing leaves the others readable."""
    import wandb

    from tests.conftest import API_KEY
    from wandb_assets.localwandb import LocalWandbServer

    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    server = LocalWandbServer(_nodes("r", 3, "llm"), entity="research", project="llm", api_key=API_KEY).start()
    try:
        server.add_project("research", "vision", _nodes("v", 2, "vision"))
        server.add_project("ci", "bench", _nodes("r", 1, "bench"))  # run id r0, as in research/llm
        api = wandb.Api(overrides={"base_url": server.url}, api_key=API_KEY, timeout=20)
        assert [p.name for p in api.projects("research", per_page=1)] == ["llm", "vision"]  # two pages
        assert [(p.entity, p.name) for p in api.projects("ci")] == [("ci", "bench")]
        assert list(api.projects("nobody")) == []
        assert server.count("GetProjects") == 4  # research: 2 pages, ci: 1, nobody: 1
        assert [r.display_name for r in api.runs("ci/bench")] == ["bench-0"]
        assert sorted(r.display_name for r in api.runs("research/llm")) == ["llm-0", "llm-1", "llm-2"]
        # A project created later is listed by a new client (the client keeps its first listing).
        server.add_project("ci", "smoke", _nodes("s", 1, "smoke"))
        assert [p.name for p in api.projects("ci")] == ["bench"]  # wandb 0.31 caches api.projects(entity)
        fresh = wandb.Api(overrides={"base_url": server.url}, api_key=API_KEY, timeout=20)
        assert [p.name for p in fresh.projects("ci")] == ["bench", "smoke"]
        # Failures injected for one project only.
        server.faults.fail_status, server.faults.fail_count = 500, -1
        server.faults.fail_projects = frozenset({"ci/bench"})
        assert [_status(server.url, path) for path in ("ci/bench", "research/vision", "ci/bench")] == [500, 200, 500]
        server.remove_project("ci", "smoke")
        server.faults.fail_status = None
        other = wandb.Api(overrides={"base_url": server.url}, api_key=API_KEY, timeout=20)
        assert [p.name for p in other.projects("ci")] == ["bench"]
    finally:
        server.stop()


def test_an_entitys_projects_are_listed_afresh_on_the_same_api(monkeypatch, tmp_path):
    """``entity/*`` must see a project created since the last tick although the process keeps one ``Api``; a
    failed listing names the entity and never the key."""
    from types import SimpleNamespace

    from tests.conftest import API_KEY
    from wandb_assets.lib.fetch import WandbFetchError, get_api, list_projects
    from wandb_assets.localwandb import LocalWandbServer
    from wandb_assets.settings import WandbSettings

    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    server = LocalWandbServer(_nodes("b", 1, "bench"), entity="ci", project="bench", api_key=API_KEY).start()
    try:
        api = get_api(
            WandbSettings(api_key=API_KEY, project="bench", entity="ci", base_url=server.url),
            SimpleNamespace(http_timeout_s=5.0, http_retries=1, retry_wait_max_s=0.5),
        )
        assert list_projects(api, "ci", API_KEY) == ["bench"]
        server.add_project("ci", "smoke")
        assert list_projects(api, "ci", API_KEY) == ["bench", "smoke"]
        server.faults.fail_status, server.faults.fail_count = 403, -1
        server.faults.fail_operations = frozenset({"GetProjects"})
        with pytest.raises(WandbFetchError) as caught:
            list_projects(api, "ci", API_KEY)
        assert str(caught.value).startswith("Listing the projects of 'ci' failed: ")
        assert API_KEY not in str(caught.value)
    finally:
        server.stop()
