-- gpu_charges (what is billed, per month, team, project, user, GPU model and price; closed months as recorded,
-- adjustments of closed months booked to the first open month): the grain every billed figure is built from.
select
    month,
    charge_category,
    adjustment_of,
    first_day,
    last_day,
    team,
    entity,
    project,
    username,
    gpu_model,
    price_basis,
    price_from,
    usd_per_gpu_hour,
    gpu_hours,
    cost_usd,
    idle_gpu_hours,
    idle_cost_usd,
    failed_gpu_hours,
    failed_cost_usd
from {{ source('warehouse', 'gpu_charges') }}
