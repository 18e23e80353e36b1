-- depends_on: {{ ref('team_gpu_cost_monthly') }}
-- depends_on: {{ ref('team_budget_vs_spend') }}
-- Which build of gpu_usage the money marts were built from (its record in warehouse_meta): `wandb-assets check`
-- compares the marts with gpu_usage month by month while gpu_usage is still that build.
select value as gpu_usage_build
from {{ source('warehouse', 'warehouse_meta') }}
where key = 'gpu_usage_build'
