"""Which W&B projects one deployment mirrors: ``WANDB_ASSETS_PROJECTS`` parsed, and the selection resolved
against the projects each entity lists.

A project is data (an ``entity`` and a ``project`` column in every table), not a copy of the pipeline: this
module only decides *which* projects; the same assets fetch and load all of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from wandb_assets.lib.errors import ConfigError

#: Every project of the entity (re-listed on every tick).
WILDCARD = "*"
#: How a listing of an entity that holds no project for the key begins (a mistyped or unknown entity): a setting's
#: mistake, refused before a CLI run starts, never a project that left.
NO_PROJECT_LISTED = "W&B lists no project of"
#: What W&B refuses in entity and project names (and what would make ``entity/project`` ambiguous).
_FORBIDDEN = re.compile(r"[/\\#?%:,\s]")


@dataclass(frozen=True, order=True)
class ProjectRef:
    """One W&B project, the key every mirrored row carries with its run id."""

    entity: str
    project: str

    def __str__(self) -> str:
        return f"{self.entity}/{self.project}"


@dataclass(frozen=True)
class ProjectSelection:
    """Named projects and entities whose every project is mirrored, in the order first given."""

    projects: tuple[ProjectRef, ...] = ()
    whole_entities: tuple[str, ...] = ()

    @property
    def entities(self) -> tuple[str, ...]:
        """Every entity the selection touches, each once, in order."""
        return tuple(dict.fromkeys([*self.whole_entities, *(p.entity for p in self.projects)]))

    def includes(self, entity: str, project: str) -> bool:
        """Whether ``entity/project`` is mirrored: named, or of an entity mirrored whole."""
        return entity in self.whole_entities or ProjectRef(entity, project) in self.projects

    def resolve(self, listed: Mapping[str, Iterable[str]]) -> list[ProjectRef]:
        """The projects to mirror now: the named ones, and every project ``listed`` for a whole entity.

        ``listed`` maps an entity to the project names W&B lists for it now; an entity missing from it (its
        listing failed) contributes only its named projects. Sorted, each once."""
        chosen = set(self.projects)
        for entity in self.whole_entities:
            chosen.update(ProjectRef(entity, name) for name in listed.get(entity, ()))
        return sorted(chosen)


def unlisted_projects(selection: ProjectSelection, listed: Mapping[str, Iterable[str]]) -> list[ProjectRef]:
    """The named projects that W&B does not list for their entity (a typo): only where ``listed`` holds the entity's
    listing (a listing that failed decides nothing)."""
    return [ref for ref in selection.projects if ref.entity in listed and ref.project not in set(listed[ref.entity])]


def unlisted_sentence(ref: ProjectRef, names: Iterable[str]) -> str:
    """The one sentence that refuses a named project W&B does not list, with what its entity does list."""
    names = sorted(names)
    has = (
        f"{ref.entity} lists {', '.join(names[:8])}{f' and {len(names) - 8} more' if len(names) > 8 else ''}"
        if names
        else f"{NO_PROJECT_LISTED} {ref.entity!r}"
    )
    return (
        f"WANDB_ASSETS_PROJECTS names {ref}, which W&B does not list for this key ({has}): check its name; nothing "
        "was changed."
    )


def _name(text: str, what: str, item: str) -> str:
    if not text or _FORBIDDEN.search(text):
        raise ConfigError(
            f"WANDB_ASSETS_PROJECTS has {item!r}: each item is entity/project or entity/* and the {what} "
            "may not be empty or contain spaces or any of / \\ # ? % : ,."
        )
    return text


def parse_projects(text: str) -> ProjectSelection:
    """Parse ``entity/project, entity/*, ...`` (spaces around items allowed, duplicates kept once)."""
    projects: dict[ProjectRef, None] = {}
    whole: dict[str, None] = {}
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise ConfigError("WANDB_ASSETS_PROJECTS is set but empty: list entity/project or entity/* items, or unset it.")
    for item in items:
        if not item:
            continue
        entity, slash, project = item.partition("/")
        if not slash:
            raise ConfigError(
                f"WANDB_ASSETS_PROJECTS has {item!r}: each item is entity/project or entity/* (such as ml-team/*)."
            )
        entity = _name(entity, "entity", item)
        if project == WILDCARD:
            whole[entity] = None
        else:
            projects[ProjectRef(entity, _name(project, "project", item))] = None
    return ProjectSelection(tuple(projects), tuple(whole))


#: W&B's clock and ours may disagree a little: activity this close before a project's last fetch counts as new.
CLOCK_MARGIN = timedelta(minutes=10)


def changed_projects(
    projects: Iterable[str],
    activity: Mapping[str, datetime | None],
    last_fetched: Mapping[str, datetime],
    must_read: Iterable[str],
    now: datetime,
    recheck: timedelta,
) -> tuple[list[str], list[str]]:
    """``(to fetch, unchanged)``: which of ``projects`` a tick must read again. A project is read again when it
    has never been read whole, when it is in ``must_read`` (the warehouse holds a run of it as alive, whose state
    may change without a heartbeat as W&B marks a silent run crashed; or its last fetch failed), when its newest
    activity (``activity``: newest run heartbeat, from ``fetch.latest_activity``; a project missing from it could
    not be probed) is later than its last whole fetch less ``CLOCK_MARGIN``, or when that fetch is older than
    ``recheck`` (edits that move no heartbeat: tags, notes, summaries updated after the end). Everything else is
    unchanged since its last fetch."""
    must_read = set(must_read)
    fetch, unchanged = [], []
    for project in projects:
        last = last_fetched.get(project)
        quiet = (
            last is not None
            and project not in must_read
            and project in activity
            and (activity[project] is None or activity[project] < last - CLOCK_MARGIN)
            and now - last < recheck
        )
        (unchanged if quiet else fetch).append(project)
    return fetch, unchanged


def format_readable_projects(
    listed: Mapping[str, Iterable[str]],
    failed: Mapping[str, str],
    selection: ProjectSelection | None,
    single: ProjectRef | None,
    where: str,
) -> str:
    """What ``wandb-assets projects`` prints: each entity the key can read with its projects, a ``*`` before each
    mirrored one (``selection``: ``WANDB_ASSETS_PROJECTS``; else ``single``, WANDB_ENTITY/WANDB_PROJECT), the
    entities whose listing failed with why, and how many are mirrored."""
    lines = [f"Entities and projects this key can read at {where} (* mirrored):"]
    mirrored = total = 0
    for entity, names in listed.items():
        names = sorted(names)
        whole = selection is not None and entity in selection.whole_entities
        lines.append(f"  {entity}: {len(names)} project(s){', mirrored whole (' + entity + '/*)' if whole else ''}")
        for name in names:
            chosen = selection.includes(entity, name) if selection else single == ProjectRef(entity, name)
            mirrored, total = mirrored + chosen, total + 1
            lines.append(f"    {'*' if chosen else ' '} {name}")
    for entity, why in failed.items():
        lines.append(f"  {entity}: not listed ({why})")
    how = "WANDB_ASSETS_PROJECTS" if selection is not None else "WANDB_ENTITY/WANDB_PROJECT"
    lines.append(f"{mirrored} of {total} project(s) mirrored ({how}).")
    return "\n".join(lines)
