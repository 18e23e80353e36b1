-- Outcomes per project and UTC day, all categories together.
select entity, project, day, completed, failed, other_ended
from {{ source('warehouse', 'success_rates') }}
where category = 'all'
