-- Each team's spend per month against its budget (WANDB_ASSETS_BUDGETS): the budget in force that month is the latest row for the
-- team whose from_month is not after it (an ASOF join). A team without a budget has NULL budget columns.
with spend as (
    select month, team, sum(cost_usd) as spend_usd, sum(unpriced_gpu_hours) as unpriced_gpu_hours
    from {{ ref('team_gpu_cost_monthly') }}
    group by all
)
select
    s.month,
    s.team,
    s.spend_usd,
    s.unpriced_gpu_hours,
    b.monthly_budget_usd as budget_usd,
    b.monthly_budget_usd - s.spend_usd as remaining_usd,
    100.0 * s.spend_usd / nullif(b.monthly_budget_usd, 0) as pct_of_budget,
    s.spend_usd > b.monthly_budget_usd as over_budget
from spend s
asof left join {{ source('warehouse', 'team_budgets') }} b on s.team = b.team and s.month >= b.from_month
