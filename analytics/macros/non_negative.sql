{#- A generic test: the column is never below zero (NULL passes: unpriced dollars are NULL, never 0). -#}
{% test non_negative(model, column_name) %}
select {{ column_name }} from {{ model }} where {{ column_name }} < 0
{% endtest %}
