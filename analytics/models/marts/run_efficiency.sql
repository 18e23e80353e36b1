-- Per run: what it cost and how well it used its GPUs. Idle share is known for ended runs whose GPU stream was
-- read whole (run_curve_idle), steady SPS for runs whose SPS curve was read; NULL elsewhere, never a guess.
with teams as (
    select distinct username, team from {{ ref('stg_gpu_usage') }} where username is not null
)
select
    r.entity,
    r.project,
    r.run_id,
    r.run_name,
    r.username,
    t.team,
    r.category,
    r.state,
    r.created_at,
    r.ended_at,
    r.created_month,
    r.gpu_count,
    r.gpu_model,
    r.gpu_hours,
    i.idle_gpu_hours,
    i.idle_gpu_hours / nullif(r.gpu_hours, 0) as idle_share,  -- NULL stays NULL (least() would make it 1)
    r.cost_usd,
    r.sps_steady,
    r.sps_steady * 3600 / nullif(r.gpu_count, 0) as steps_per_gpu_hour,
    r.url
from {{ ref('stg_runs') }} r
left join {{ ref('stg_run_curve_idle') }} i using (entity, project, run_id)
left join teams t using (username)
