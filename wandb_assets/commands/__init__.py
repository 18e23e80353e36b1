"""The ``wandb-assets`` commands, by what they do (``cli.py`` holds only their arguments): ``runs`` (the pipeline's
Dagster jobs in this process), ``reading`` (the warehouse read, no run), ``servers`` (the UI and the dbt docs on
loopback), ``demo`` (the synthetic fleet end to end) and ``common`` (what they share: the instance, the checks
before any run, the exit status)."""
