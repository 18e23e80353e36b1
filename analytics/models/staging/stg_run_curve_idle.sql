-- Idle GPU-hours of each ended run whose GPU stream was read, summed over its days.
select entity, project, run_id, sum(idle_gpu_hours) as idle_gpu_hours
from {{ source('warehouse', 'run_curve_idle') }}
group by all
