-- gpu_usage (one row per UTC day, project, user, team, category and GPU model) with its month: the grain every
-- dollar figure is built from, so every mart's dollars add up to gpu_usage's to the cent.
select
    day,
    date_trunc('month', day)::date as month,
    entity,
    project,
    username,
    team,
    category,
    gpu_model,
    runs,
    gpu_hours,
    cost_usd,
    price_basis,
    idle_gpu_hours,
    idle_cost_usd,
    failed_gpu_hours,
    failed_cost_usd
from {{ source('warehouse', 'gpu_usage') }}
