"""The pull requests' verdicts delivered to GitHub (``github_checks``): after each feed that judged PR runs, the items
``pr_checks`` queued (``lib/acting/pr_outbox.py``) go out as check runs and one comment per PR, through PyGithub, as a
GitHub App (a JWT exchanged for an installation token) or with a token. The warehouse is closed while GitHub is asked.

PyGithub, not githubkit or ghapi: it is synchronous as these assets are, adds two small packages (githubkit adds
30 MB of generated schemas, and its resolution here picked hishel 2.0.0, with which it does not import), and does the
App's JWT and token exchange itself. Its own retries are off: the outbox retries, at the next run, without doubling.
"""

import uuid
from collections import Counter

from dagster import (
    AssetExecutionContext,
    AssetKey,
    ConfigurableResource,
    DagsterRunStatus,
    DefaultSensorStatus,
    MaterializeResult,
    MetadataValue,
    ResourceDependency,
    RunRequest,
    SkipReason,
    asset,
    define_asset_job,
    in_process_executor,
    run_status_sensor,
)

from wandb_assets.defs.feed.assets import ClockConfig
from wandb_assets.defs.feed.jobs import feed_job
from wandb_assets.defs.wandb_runs.resources import WandbResource
from wandb_assets.defs.warehouse.named import names_the_warehouse
from wandb_assets.defs.warehouse.resources import WAREHOUSE_POOL, WarehouseResource
from wandb_assets.lib.acting.channels import AuthRefused, Outage, Undeliverable, http_error
from wandb_assets.lib.acting.pr_outbox import (
    CHECK_NAME,
    DELIVERED,
    MARKER,
    PENDING,
    REFUSED,
    Refused,
    claim,
    deliver,
    delivered_checks,
    record,
)
from wandb_assets.settings import ConfigError, GitHubTarget, github_target, pem_text

GITHUB_CHECKS_JOB = "github_delivery"
#: What a refused credential names.
CREDENTIAL_SETTINGS = "WANDB_ASSETS_GITHUB_APP_ID and WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY, or WANDB_ASSETS_GITHUB_TOKEN"
#: GitHub's limit on a check run's summary, characters.
SUMMARY_LIMIT = 65_535
_CONCLUSION_TO_STATUS = {"failure": "failure", "neutral": "success", "success": "success"}


class GitHubResource(ConfigurableResource):
    """GitHub's REST API for ``WANDB_ASSETS_GITHUB_REPO``. The App's private key or the token comes from the
    environment, else from the W&B secret's key of the same name; it is read at each run and kept in memory only
    (never resource config, never in a log, metadata or an error's text)."""

    wandb: ResourceDependency[WandbResource]
    timeout_s: int = 10
    #: GitHub's secondary rate limit allows 80 content-creating requests a minute: writes are paced to it (a backlog
    #: after an outage goes out at that pace; a rate-limit answer leaves the rest for the next run).
    seconds_between_writes: float = 0.75

    def _from_secret(self, name: str) -> str | None:
        if not self.wandb.secret_in_use():
            return None
        return (self.wandb.load_secret(self.wandb.resolved_secret_name(), name).get(name) or "").strip() or None

    def channel(self, target: GitHubTarget) -> "PyGitHubChannel":
        """A channel to the repository; ``ConfigError`` when no credential is configured anywhere."""
        if target.app_id is not None:
            key = target.private_key.get_secret_value() if target.private_key else None
            key = key or self._from_secret("WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY")
            if key is None:
                raise ConfigError(
                    "WANDB_ASSETS_GITHUB_APP_ID is set, but no private key is: set WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY "
                    "(or the secret's key of that name)."
                )
            return PyGitHubChannel(target, self.timeout_s, self.seconds_between_writes, app_key=pem_text(key))
        token = target.token.get_secret_value().strip() if target.token else None
        token = token or self._from_secret("WANDB_ASSETS_GITHUB_TOKEN")
        if token is None:
            raise ConfigError(
                f"WANDB_ASSETS_GITHUB_REPO is {target.repo}, but no credential is set: set WANDB_ASSETS_GITHUB_APP_ID "
                "and WANDB_ASSETS_GITHUB_APP_PRIVATE_KEY, or WANDB_ASSETS_GITHUB_TOKEN (or the secret's)."
            )
        return PyGitHubChannel(target, self.timeout_s, self.seconds_between_writes, token=token)


class PyGitHubChannel:
    """``acting.pr_outbox.GitHubChannel`` over PyGithub. Errors become ``Outage`` (GitHub unreachable, 5xx, rate limits,
    credentials refused: the item waits) or ``Refused`` (any other 4xx); their text is GitHub's status and message,
    never a request's headers."""

    def __init__(
        self, target: GitHubTarget, timeout_s: int, pace_s: float, app_key: str | None = None, token: str | None = None
    ):
        self._target, self._timeout, self._pace = target, timeout_s, pace_s
        self._app_key, self._token = app_key, token
        self._repo = None
        self._commits: dict[str, object] = {}
        self._statuses_only = False
        self._login: str | None = None
        self._app = self._client = None  # made with the repository (``_repository``)
        self._pulls: dict[int, object] = {}

    def _call(self, what: str, call):
        """``call()`` of PyGithub, its errors in the notifier's classes (``acting.channels.http_error``): 429, 5xx and
        rate limits wait (``Outage``), 401/403 name the credential's settings (``AuthRefused``, waiting too), any other
        4xx is ``Refused``; an answer the client cannot read is "GitHub answered unexpectedly", not an outage of
        the network."""
        from github import GithubException, RateLimitExceededException

        try:
            return call()
        except RateLimitExceededException:
            raise Outage(f"GitHub's rate limit was reached ({what})") from None
        except GithubException as exc:
            message = exc.data.get("message") if isinstance(exc.data, dict) else None
            error = http_error("GitHub", exc.status, message, what, CREDENTIAL_SETTINGS)
            if isinstance(error, Undeliverable):
                raise Refused(str(error)) from None
            raise error from None
        except (Outage, Refused):
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # an answer PyGithub cannot read
            raise Outage(f"GitHub answered unexpectedly ({type(exc).__name__}; {what})") from None
        except Exception as exc:  # noqa: BLE001 - connection trouble of any kind: the item waits
            raise Outage(f"GitHub unreachable ({type(exc).__name__}; {what})") from None

    def _repository(self):
        if self._repo is None:
            from github import Auth, Github, GithubIntegration

            common = {
                "base_url": self._target.api_url,
                "timeout": self._timeout,
                "retry": None,
                "seconds_between_writes": self._pace,
            }
            if self._app_key is not None:
                app = self._app = GithubIntegration(auth=Auth.AppAuth(self._target.app_id, self._app_key), **common)
                owner, name = self._target.repo.split("/")
                installation = self._call("the App's installation", lambda: app.get_repo_installation(owner, name))
                self._client = app.get_github_for_installation(installation.id)
            else:
                self._client = Github(auth=Auth.Token(self._token), **common)
            self._repo = self._call("the repository", lambda: self._client.get_repo(self._target.repo))
        return self._repo

    def _commit(self, commit: str):
        if commit not in self._commits:
            repo = self._repository()
            self._commits[commit] = self._call(f"commit {commit}", lambda: repo.get_commit(commit))
        return self._commits[commit]

    def full_sha(self, commit: str) -> str:
        try:
            found = self._commit(commit)
        except Refused as exc:
            raise Refused(f"{commit} is not a commit of {self._target.repo}: {exc}") from None
        self._commits[found.sha] = found
        return found.sha

    def upsert_check(self, sha: str, conclusion: str, title: str, summary: str) -> tuple[int, str]:
        commit, repo = self._commit(sha), self._repository()
        output = {"title": title[:1000], "summary": summary[:SUMMARY_LIMIT]}
        if not self._statuses_only:
            held = self._call("check runs", lambda: list(commit.get_check_runs(check_name=CHECK_NAME)))
            try:
                if held:
                    self._call(
                        "check run edit", lambda: held[0].edit(status="completed", conclusion=conclusion, output=output)
                    )
                    return held[0].id, "check_run"
                made = self._call(
                    "check run",
                    lambda: repo.create_check_run(
                        CHECK_NAME, sha, status="completed", conclusion=conclusion, output=output
                    ),
                )
                return made.id, "check_run"
            except (Refused, AuthRefused) as exc:  # GitHub's 403 to a personal token making a check run
                if self._token is None or " 403" not in str(exc):
                    raise
                self._statuses_only = True  # a personal token cannot make check runs: a commit status instead
        status = self._call(
            "commit status",
            lambda: commit.create_status(
                _CONCLUSION_TO_STATUS[conclusion], description=title[:140], context=CHECK_NAME
            ),
        )
        return status.id, "commit_status"

    def _pull(self, pr: int):
        """PR ``pr`` (asked once per channel): a pull request, never a plain issue of that number."""
        if pr not in self._pulls:
            repo = self._repository()
            self._pulls[pr] = self._call(f"PR {pr}", lambda: repo.get_pull(pr))
        return self._pulls[pr]

    def pr_commits(self, pr: int) -> set[str]:
        pull = self._pull(pr)
        return {pull.head.sha} | set(self._call(f"PR {pr}'s commits", lambda: [c.sha for c in pull.get_commits()]))

    def _author(self) -> str:
        """Who this deployment writes as: the App's bot (``<slug>[bot]``), or the token's user."""
        if self._login is None:
            self._repository()
            self._login = self._call("who this deployment is", self._who)
        return self._login

    def _who(self) -> str:
        if self._app is not None:
            return f"{self._app.get_app().slug}[bot]"
        return self._client.get_user().login

    def upsert_comment(self, pr: int, body: str) -> int:
        repo, me = self._repository(), self._author()
        self._pull(pr)
        issue = self._call(f"PR {pr}", lambda: repo.get_issue(pr))
        held = self._call(
            f"PR {pr}'s comments",
            lambda: [c for c in issue.get_comments() if MARKER in (c.body or "") and c.user and c.user.login == me],
        )
        if held:
            self._call(f"PR {pr}'s comment", lambda: held[0].edit(body))
            return held[0].id
        return self._call(f"PR {pr}'s comment", lambda: issue.create_comment(body)).id


@asset(
    description="The pull requests' throughput verdicts on GitHub (WANDB_ASSETS_GITHUB_REPO): each judged commit gets "
    "the check run `wandb-assets / throughput` (failure on a regression while WANDB_ASSETS_PR_GATE is on, neutral "
    "without a baseline, success otherwise), each PR one comment updated in place. Sent from the outbox "
    "`github_deliveries`: GitHub down, they wait; never a second check or comment. Off without a repository.",
    group_name="feed",
    owners=["team:ml-platform"],
    deps=[AssetKey("pr_checks")],
    pool=WAREHOUSE_POOL,
    kinds={"github", "duckdb"},
)
@names_the_warehouse
def github_checks(
    context: AssetExecutionContext, config: ClockConfig, warehouse: WarehouseResource, github: GitHubResource
) -> MaterializeResult:
    target = github_target()
    if target is None:
        return MaterializeResult(metadata={"github": "off (WANDB_ASSETS_GITHUB_REPO not set)"})
    now, token = config.resolve(), uuid.uuid4().hex
    with warehouse.get_connection() as con:
        claimed = claim(con, target.repo, token, now)
        delivered = delivered_checks(con, target.repo, claimed)
    outcomes = deliver(claimed, github.channel(target), now, delivered) if claimed else []
    with warehouse.get_connection() as con:
        record(con, token, outcomes)
    waiting = {
        o["error"] for o in outcomes if o["state"] == PENDING and not (o.get("error") or "").startswith("not tried")
    }
    for error in sorted(waiting):
        context.log.warning(f"GitHub: {error}; its items wait for the next run.")
    for o in outcomes:
        if o["state"] != PENDING:
            context.log.info(
                f"GitHub: PR {o['pr']} {o['item']}: {o['state']}" + (f" ({o['error']})" if o.get("error") else "")
            )
    states = Counter(o["state"] for o in outcomes)
    return MaterializeResult(
        metadata={
            "repo": target.repo,
            "gate": "on" if target.gate else "off",
            "delivered": states[DELIVERED],
            "waiting": states[PENDING],
            "refused": states[REFUSED],
            "items": MetadataValue.json(
                [{k: o.get(k) for k in ("pr", "item", "state", "channel", "target_id", "error")} for o in outcomes]
            ),
        }
    )


github_checks_job = define_asset_job(
    GITHUB_CHECKS_JOB,
    selection=[github_checks],
    executor_def=in_process_executor,
    tags={"dagster/max_runtime": "600"},
    description="Deliver the pull requests' verdicts that pr_checks queued to GitHub (check runs, one comment per PR).",
)


@run_status_sensor(
    run_status=DagsterRunStatus.SUCCESS,
    monitored_jobs=[feed_job],
    request_job=github_checks_job,
    default_status=DefaultSensorStatus.RUNNING,
    description="After each successful feed (which judged the PR runs that ended): deliver the verdicts to GitHub.",
)
def after_feed_to_github(context):
    if github_target() is None:
        return SkipReason("WANDB_ASSETS_GITHUB_REPO is not set: the verdicts stay in pr_checks.")
    return RunRequest(run_key=f"feed:{context.dagster_run.run_id}")
