-- The chargeback: what is billed per calendar month (UTC), team, project, GPU model and price, from gpu_charges: an
-- open month's usage, a closed month exactly as recorded when it was closed, and the adjustments of closed months
-- booked to the first open month after them (charge_category adjustment, adjustment_of the month restated), so every
-- month's dollars equal gpu_charges' to the cent (tests/chargeback_matches_gpu_charges.sql).
-- `wandb-assets export chargeback --month YYYY-MM` writes one month of it for finance.
select
    month,
    team,
    entity,
    project,
    gpu_model,
    coalesce(price_basis, 'unpriced') as price_basis,
    price_from,
    usd_per_gpu_hour,
    charge_category,
    adjustment_of,
    count(distinct username) as users,
    sum(gpu_hours) as gpu_hours,
    sum(cost_usd) as cost_usd,
    coalesce(sum(gpu_hours) filter (where cost_usd is null), 0) as unpriced_gpu_hours,
    sum(idle_gpu_hours) as idle_gpu_hours,
    sum(idle_cost_usd) as idle_cost_usd,
    sum(failed_gpu_hours) as failed_gpu_hours,
    sum(failed_cost_usd) as failed_cost_usd,
    min(first_day) as first_day,
    max(last_day) as last_day
from {{ ref('stg_gpu_charges') }}
group by all
