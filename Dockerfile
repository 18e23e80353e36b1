# The user-code image: the wandb_assets code location served over gRPC (`dagster code-server start`), for the
# official dagster/dagster Helm chart (deploy/helm/values.yaml) or any grpc_server workspace
# (deploy/workspace.yaml). Runs launched by the K8sRunLauncher use the same image.
# BASE_IMAGE: any Debian bookworm image with Python 3.11 and pip; where no registry is reachable,
# deploy/docker/debian-python-base.sh makes one from the Debian mirror.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ENV UV_NO_PROGRESS=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    PATH=/opt/wandb-assets/.venv/bin:$PATH \
    DAGSTER_HOME=/opt/dagster/home \
    WANDB_DIR=/tmp/wandb \
    WANDB_ASSETS_DUCKDB=/data/warehouse.duckdb

RUN pip install --no-cache-dir "uv>=0.5,<1"

WORKDIR /opt/wandb-assets
# Dependencies first, from the lockfile only: this layer is rebuilt only when the lockfile changes.
COPY pyproject.toml uv.lock ./
RUN uv sync --locked --no-dev --no-install-project
COPY README.md setup.py ./
COPY wandb_assets ./wandb_assets
# The project, with its native .wandb reader and curves' scan (setup.py builds wandb_assets/lib/_wandb_log.c and
# _curves_scan.c): a C compiler (and Python's headers where the base image lacks them, as Debian's python3 does) for
# the build only, removed in the same layer; the build fails here if either was not built.
RUN build="gcc libc6-dev" \
    && if [ ! -f "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then \
         build="$build python3-dev"; fi \
    && apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $build >/dev/null \
    && uv sync --locked --no-dev \
    && .venv/bin/python -c "from wandb_assets.lib.offline_runs import reader; assert reader() == 'native'" \
    && .venv/bin/python -c "from wandb_assets.lib.curves import scanner; assert scanner() == 'native'" \
    && apt-get purge -y -qq --auto-remove $build >/dev/null \
    && rm -rf /var/lib/apt/lists/*

# The analysts' dbt project and its manifest, made now (dbt parse, offline) so no process parses it at start or
# per run; dbt writes its run folders under analytics/target at run time (owned by the dagster user below).
COPY analytics ./analytics
RUN dagster-dbt project prepare-and-package --file wandb_assets/defs/analytics/project.py \
    && test -s analytics/target/manifest.json

# The instance for `docker run` and compose (PostgreSQL storage from the DAGSTER_PG_* variables; the Helm chart sets
# its own DAGSTER_HOME and instance instead), and a non-root user.
COPY deploy/postgres/dagster.yaml /opt/dagster/home/dagster.yaml
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin dagster \
    && mkdir -p /data /tmp/wandb \
    && chown -R dagster:dagster /opt/dagster /data /tmp/wandb /opt/wandb-assets/analytics
USER 10001

# No ENTRYPOINT: the Helm chart and the K8sRunLauncher give whole command lines as container args (the code
# server's `dagster code-server start -h 0.0.0.0 -p 4000 -m ...`, a run pod's `dagster api execute_run ...`), which
# an ENTRYPOINT would get appended to. CMD is what `docker run IMAGE` serves. Never expose port 4000 outside the
# cluster: the code server has no authentication.
EXPOSE 4000
CMD ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", "4000", "-m", "wandb_assets.definitions"]
