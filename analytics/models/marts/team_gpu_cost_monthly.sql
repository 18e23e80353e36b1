-- The chargeback: GPU-hours and dollars per calendar month (UTC), team, project and GPU model, from gpu_usage's
-- rows, so every month's dollars equal gpu_usage's to the cent (tests/chargeback_matches_gpu_usage.sql).
-- `wandb-assets export chargeback --month YYYY-MM` writes one month of it for finance.
select
    month,
    team,
    entity,
    project,
    gpu_model,
    coalesce(price_basis, 'unpriced') as price_basis,
    count(distinct username) as users,
    sum(gpu_hours) as gpu_hours,
    sum(cost_usd) as cost_usd,
    coalesce(sum(gpu_hours) filter (where cost_usd is null), 0) as unpriced_gpu_hours,
    sum(idle_gpu_hours) as idle_gpu_hours,
    sum(idle_cost_usd) as idle_cost_usd,
    sum(failed_gpu_hours) as failed_gpu_hours,
    sum(failed_cost_usd) as failed_cost_usd,
    max(day) as last_day
from {{ ref('stg_gpu_usage') }}
group by all
