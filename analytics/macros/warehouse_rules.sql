{#- Generated from wandb_assets/lib (`python -m wandb_assets.lib.schema_docs --dbt-macros`): the
    pipeline's rules, one definition. Do not edit by hand. -#}

{% macro failed_states() %}('failed', 'crashed'){% endmacro %}

{% macro ended_states() %}('finished', 'failed', 'crashed', 'killed', 'preempted'){% endmacro %}

{#- A run's GPU-hours seen at `now` (SQL): its GPUs times the span it held them (the gpu_usage rule). -#}
{% macro run_gpu_hours(now) %}gpu_count * greatest(epoch(CASE WHEN state IN ('finished', 'failed', 'crashed', 'killed', 'preempted') THEN ended_at WHEN state IN ('running', 'preempting') THEN {{ now }} WHEN state = 'vanished' THEN least(heartbeat_at, {{ now }}) END) - epoch(created_at), 0) / 3600.0{% endmacro %}

{#- Completed out of completed + failed, percent; NULL when both are 0 (counts summed first). -#}
{% macro success_rate_pct(completed, failed) %}100.0 * ({{ completed }}) / nullif(({{ completed }}) + ({{ failed }}), 0){% endmacro %}
