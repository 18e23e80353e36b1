-- One row per run: the columns analysts join on, and the facts every mart repeats (its month, whether it ended or
-- failed, its GPU-hours so far), by the pipeline's own rules (macros/warehouse_rules.sql).
select
    entity,
    project,
    run_id,
    coalesce(name, run_id) as run_name,
    "user" as username,
    state,
    category,
    state in {{ ended_states() }} as has_ended,
    state in {{ failed_states() }} as has_failed,
    created_at,
    ended_at,
    date_trunc('month', created_at)::date as created_month,
    gpu_count,
    gpu_model,
    -- its GPUs times the hours it held them, to its end or (alive) to this build: the pipeline's rule
    {{ run_gpu_hours('now()::timestamp') }} as gpu_hours,
    cost_usd,
    sps_steady,
    curves_status,
    ci_branch,
    ci_config,
    url
from {{ source('warehouse', 'runs') }}
where created_at is not null
