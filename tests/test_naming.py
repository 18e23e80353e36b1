from datetime import UTC, datetime

import pytest

from wandb_assets.lib.naming import categorize, parse_ci_name, parse_ci_timestamp


@pytest.mark.parametrize(
    ("name", "sweep", "expected"),
    [
        ("github.sky.main.abc1234.ppo.1700000000", None, "push_to_main"),
        ("github.sky.pr42.abc1234.ppo.1700000000", None, "push_to_main"),
        ("github.sky.main.abc1234.ppo.sweep.1700000000", "sw1", "push_to_main"),  # CI rule is checked first
        ("lr-search", "sw1", "sweep"),
        ("LR.Sweep-3", None, "sweep"),
        ("my.sweeper", None, "sweep"),  # contains ".sweep"
        ("sweep-without-dot", None, "regular"),
        ("train-llama", None, "regular"),
        (None, None, "regular"),
        ("", None, "regular"),
        (None, "sw9", "sweep"),
        ("Github.sky.main.x.y.1", None, "regular"),  # prefix is case-sensitive
    ],
)
def test_categorize(name, sweep, expected):
    assert categorize(name, sweep) == expected


def test_parse_main_ci_name():
    parsed = parse_ci_name("github.sky.main.0f3c2ab.ppo_atari.1700000000")
    assert (parsed.branch, parsed.commit, parsed.config) == ("main", "0f3c2ab", "ppo_atari")
    assert parsed.timestamp == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)


def test_parse_pr_name_with_dotted_config():
    parsed = parse_ci_name("github.sky.pr1234.deadbee.impala.large.v2.20261101T120000Z")
    assert (parsed.branch, parsed.commit, parsed.config) == ("pr1234", "deadbee", "impala.large.v2")
    assert parsed.timestamp == datetime(2026, 11, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "name",
    [
        None,
        "train-llama",
        "github.sky.main.abc",  # too few parts
        "github.sky.feature.abc.cfg.1700000000",  # branch is neither main nor prN
        "github.sky.prx.abc.cfg.1700000000",
        "github.sky.main..cfg.1700000000",  # empty commit
    ],
)
def test_malformed_ci_names_are_not_parsed(name):
    assert parse_ci_name(name) is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1700000000", datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
        ("1700000000123", datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)),
        ("20261102030405", datetime(2026, 11, 2, 3, 4, 5, tzinfo=UTC)),
        ("not-a-time", None),
        ("123", None),
    ],
)
def test_parse_ci_timestamp(raw, expected):
    assert parse_ci_timestamp(raw) == expected


def test_unparseable_timestamp_keeps_other_fields():
    parsed = parse_ci_name("github.sky.main.abc.cfg.whenever")
    assert (parsed.config, parsed.timestamp, parsed.raw_timestamp) == ("cfg", None, "whenever")
