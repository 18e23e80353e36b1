"""The teams file (``WANDB_ASSETS_TEAMS``): which team each W&B user is in, and where each person and team is told
things (their Slack user and channel). No Dagster, no environment reads.

Two forms per team, mixed freely::

    vision: [alice, bob]               # W&B usernames
    research:
      channel: C0RESEARCH              # the team's Slack channel id
      users:
        - {user: ana, slack: U0ANA}    # W&B username -> Slack user id
        - bo                           # found by the W&B user's e-mail (Slack users.lookupByEmail)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from wandb_assets.lib.errors import ConfigError


@dataclass(frozen=True)
class TeamDirectory:
    """``teams``: team by W&B username; ``slack_users``: Slack user id by W&B username (where the file gives one);
    ``channels``: Slack channel id by team (where the file gives one)."""

    teams: dict[str, str] = field(default_factory=dict)
    slack_users: dict[str, str] = field(default_factory=dict)
    channels: dict[str, str] = field(default_factory=dict)


def _member(entry: Any, team: str, where: str) -> tuple[str, str | None]:
    if isinstance(entry, str) and entry.strip():
        return entry.strip(), None
    if isinstance(entry, Mapping) and set(entry) <= {"user", "slack"}:
        user, slack = entry.get("user"), entry.get("slack")
        if isinstance(user, str) and user.strip() and (slack is None or (isinstance(slack, str) and slack.strip())):
            return user.strip(), slack.strip() if slack else None
    raise ConfigError(
        f"{where} gives team {team!r} the member {entry!r}: write a W&B username, or {{user: name, slack: U0ID}}."
    )


def parse_team_directory(document: Any, where: str) -> TeamDirectory:
    """The parsed YAML of a teams file; a ``ConfigError`` (one sentence) for anything else, and for a user in two teams
    (a GPU-hour is counted once)."""
    if not isinstance(document, Mapping):
        raise ConfigError(f"{where} must map teams to lists of W&B usernames (such as vision: [alice, bob]).")
    directory = TeamDirectory()
    for name, value in document.items():
        team = str(name)
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"channel", "users"})
            if unknown or not isinstance(value.get("users"), list):
                raise ConfigError(
                    f"{where} gives team {team!r} {dict(value)!r}: a team is a list of W&B usernames, or "
                    "{channel: C0ID, users: [...]}" + (f" (unknown key {unknown[0]!r})." if unknown else ".")
                )
            channel = value.get("channel")
            if channel is not None:
                if not isinstance(channel, str) or not channel.strip():
                    raise ConfigError(f"{where} gives team {team!r} the channel {channel!r}: write a Slack channel id.")
                directory.channels[team] = channel.strip()
            members = value["users"]
        elif isinstance(value, list):
            members = value
        else:
            raise ConfigError(f"{where} gives team {team!r} {value!r}: list the W&B usernames of each team.")
        for entry in members:
            user, slack = _member(entry, team, where)
            if directory.teams.setdefault(user, team) != team:
                raise ConfigError(f"{where} puts {user!r} in two teams ({directory.teams[user]}, {team}).")
            if slack:
                directory.slack_users[user] = slack
    return directory


def parse_teams(document: Any, where: str) -> dict[str, str]:
    """``{W&B username: team}`` of a teams file (``parse_team_directory``)."""
    return parse_team_directory(document, where).teams
