-- Idle GPUs per ISO week (UTC, from Monday), W&B user and team: the idle GPU-hours and dollars gpu_usage counts (so the
-- week's idle dollars add up to gpu_usage's), and what the idle ladder did about them (idle_actions): runs whose owner
-- was told, runs stopped, stops that were only recorded (stop_runs off) or refused, and the user's worst episode.
-- The weekly digest to each owner and team is read from here.
with usage as (
    select
        date_trunc('week', day)::date as week,
        username,
        team,
        sum(gpu_hours) as gpu_hours,
        sum(idle_gpu_hours) as idle_gpu_hours,
        sum(idle_cost_usd) as idle_cost_usd
    from {{ ref('stg_gpu_usage') }}
    group by all
),

ladder as (
    select
        date_trunc('week', episode_started_at)::date as week,
        details ->> 'user' as username,
        entity,
        project,
        run_id,
        episode_started_at,
        max(idle_gpu_hours) as episode_idle_gpu_hours,
        max(idle_usd) as episode_idle_usd,
        bool_or(audience in ('owner', 'team') and outcome = 'sent') as told,
        bool_or(audience = 'stop' and outcome = 'stopped') as stopped,
        bool_or(audience = 'stop' and outcome = 'would_stop') as would_stop,
        bool_or(audience = 'stop' and outcome = 'refused') as refused
    from {{ source('warehouse', 'idle_actions') }}
    group by all
),

acted as (
    select
        week,
        username,
        count(*) filter (where told) as runs_told,
        count(*) filter (where stopped) as runs_stopped,
        count(*) filter (where would_stop) as runs_would_stop,
        count(*) filter (where refused) as stops_refused,
        arg_max(entity || '/' || project || '/' || run_id, episode_idle_gpu_hours) as worst_run,
        max(episode_idle_gpu_hours) as worst_run_idle_gpu_hours
    from ladder
    group by all
)

select
    coalesce(u.week, a.week) as week,
    coalesce(u.username, a.username) as username,
    coalesce(u.team, 'unassigned') as team,
    coalesce(u.gpu_hours, 0) as gpu_hours,
    coalesce(u.idle_gpu_hours, 0) as idle_gpu_hours,
    u.idle_cost_usd,
    coalesce(a.runs_told, 0) as runs_told,
    coalesce(a.runs_stopped, 0) as runs_stopped,
    coalesce(a.runs_would_stop, 0) as runs_would_stop,
    coalesce(a.stops_refused, 0) as stops_refused,
    a.worst_run,
    a.worst_run_idle_gpu_hours
from usage as u
full outer join acted as a on u.week = a.week and u.username is not distinct from a.username
