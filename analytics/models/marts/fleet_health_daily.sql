-- One row per UTC day: runs started and ended, success rate, GPU-hours and dollars, idle and failed shares.
with usage as (
    select day, sum(gpu_hours) as gpu_hours, sum(cost_usd) as cost_usd, sum(idle_gpu_hours) as idle_gpu_hours,
           sum(failed_gpu_hours) as failed_gpu_hours
    from {{ ref('stg_gpu_usage') }} group by day
),
outcomes as (
    select day, sum(completed) as completed, sum(failed) as failed, sum(other_ended) as other_ended
    from {{ ref('stg_success_rates') }} group by day
),
started as (
    select created_at::date as day, count(*) as runs_started from {{ ref('stg_runs') }} group by all
),
days as (
    select day from usage union select day from outcomes union select day from started
)
select
    d.day,
    coalesce(s.runs_started, 0) as runs_started,
    coalesce(o.completed, 0) as completed,
    coalesce(o.failed, 0) as failed,
    coalesce(o.other_ended, 0) as other_ended,
    {{ success_rate_pct('coalesce(o.completed, 0)', 'coalesce(o.failed, 0)') }} as success_rate_pct,
    coalesce(u.gpu_hours, 0) as gpu_hours,
    u.cost_usd,
    coalesce(u.idle_gpu_hours, 0) as idle_gpu_hours,
    100.0 * u.idle_gpu_hours / nullif(u.gpu_hours, 0) as idle_pct,
    100.0 * u.failed_gpu_hours / nullif(u.gpu_hours, 0) as failed_gpu_hours_pct
from days d
left join usage u using (day)
left join outcomes o using (day)
left join started s using (day)
