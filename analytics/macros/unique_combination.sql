{#- A generic test: no two rows share these columns (NULLs compare equal). The offline stand-in for
    dbt_utils.unique_combination_of_columns (no packages: dbt deps would need the network). -#}
{% test unique_combination(model, columns) %}
select {{ columns | join(', ') }}, count(*) as n_rows
from {{ model }}
group by {{ columns | join(', ') }}
having count(*) > 1
{% endtest %}
