-- Every month's chargeback dollars and GPU-hours equal what gpu_charges bills in it, to the cent: a row here is a
-- month that does not.
{{ config(meta={"dagster": {"ref": {"name": "team_gpu_cost_monthly"}}}) }}
with chargeback as (
    select month, sum(cost_usd) as cost_usd, sum(gpu_hours) as gpu_hours
    from {{ ref('team_gpu_cost_monthly') }} group by month
),
billed as (
    select month, sum(cost_usd) as cost_usd, sum(gpu_hours) as gpu_hours
    from {{ source('warehouse', 'gpu_charges') }} group by 1
)
select *
from billed u full outer join chargeback c using (month)
where abs(coalesce(u.cost_usd, 0) - coalesce(c.cost_usd, 0)) >= 0.005
   or abs(coalesce(u.gpu_hours, 0) - coalesce(c.gpu_hours, 0)) >= 0.0001
   or (u.month is null) <> (c.month is null)
