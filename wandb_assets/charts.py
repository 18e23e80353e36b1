"""The notebooks' charts: one function per chart, so every notebook draws them the same way and a test can draw
them too. Each chart has a title, axis labels with units, a legend outside the plotted area (it hides no
data), marks what is not a whole day, and is shown as a PNG with alt text saying what it shows.

Nothing here imports Dagster; it needs matplotlib and IPython (the notebook extras).
"""

from __future__ import annotations

import io
import textwrap
from datetime import date

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

#: Grey band over a day whose numbers cover only part of it.
PARTIAL_STYLE = {"color": "0.85", "alpha": 0.6, "zorder": 0, "linewidth": 0}


def show(fig: Figure, alt: str):
    """Display ``fig`` as a PNG whose alt text is ``alt`` (kept in the notebook and in its HTML export),
    and close it. Returns the ``IPython.display.Image``."""
    from IPython.display import Image, display

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    image = Image(data=buffer.getvalue(), format="png", alt=alt)
    display(image)
    return image


def _legend_outside(ax: Axes, title: str | None = None) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False, title=title)


def _mark_partial_days(ax: Axes, days: list[date], partial: dict[date, str], bars: bool = False) -> list[str]:
    """Grey out partial days (``bars``: categorical x positions) and return the notes for the alt text."""
    notes: list[str] = []
    for day, reason in sorted(partial.items()):
        if day not in days:
            continue
        label = "partial day" if not notes else None  # one legend entry for all bands
        if bars:
            position = days.index(day)
            ax.axvspan(position - 0.5, position + 0.5, label=label, **PARTIAL_STYLE)
        else:
            middle = pd.Timestamp(day)
            ax.axvspan(middle - pd.Timedelta(hours=12), middle + pd.Timedelta(hours=12), label=label, **PARTIAL_STYLE)
        notes.append(f"{day} is partial ({reason})")
    return notes


def gauges_over_time(gauges: pd.DataFrame, thresholds: dict[str, float]) -> str:
    """Three panels of the fleet gauges per snapshot: runs, success rates (with the alert threshold) and
    GPU-hours. ``gauges``: ``warehouse.gauges_over_time``. Returns the alt text."""
    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    runs = gauges.reindex(columns=["wandb.runs.active", "wandb.runs.completed_24h", "wandb.runs.failed_24h"])
    runs.rename(columns=lambda c: c.removeprefix("wandb.runs.")).plot(ax=axes[0], marker=".")
    axes[0].set(title="Runs: alive now, and ended in the 24 h before each snapshot", ylabel="runs")
    rates = gauges.reindex(columns=["wandb.push_to_main.success_rate_pct", "wandb.sweep.success_rate_pct"])
    rates.rename(columns=lambda c: c.split(".")[1]).plot(ax=axes[1], marker=".")
    minimum = thresholds["success_rate_min_pct"]
    axes[1].axhline(minimum, color="red", linestyle="--", linewidth=1, label=f"push-to-main alert below {minimum:g}%")
    axes[1].set(title="Success rate over the 24 h before each snapshot", ylabel="success rate, %", ylim=(0, 105))
    gauges.reindex(columns=["wandb.training.total_gpu_hours_24h"]).rename(columns=lambda c: "all runs").plot(
        ax=axes[2], marker="."
    )
    axes[2].set(title="GPU-hours used in the 24 h before each snapshot", ylabel="GPU-hours", xlabel="snapshot (UTC)")
    for ax in axes:
        _legend_outside(ax)
    fig.tight_layout()
    span = f"{len(gauges)} snapshots from {_when(gauges.index.min())} to {_when(gauges.index.max())} UTC"
    alt = (
        f"Fleet gauges over time, {span}. Runs alive, completed and failed in each 24 h window; push-to-main and "
        f"sweep success rates against the {minimum:g}% push-to-main alert line; GPU-hours per 24 h window."
    )
    if len(gauges):
        last = gauges.iloc[-1]
        alt += f" Latest: {last.get('wandb.runs.active', float('nan')):.0f} runs alive, push-to-main success " + (
            f"{last.get('wandb.push_to_main.success_rate_pct', float('nan')):.1f}%."
        )
    show(fig, alt)
    return alt


def daily_success_rate(daily: pd.DataFrame, partial: dict[date, str], thresholds: dict[str, float]) -> str:
    """Daily success rate per category with the alert threshold; partial days greyed. ``daily``:
    ``warehouse.daily_fleet``. Returns the alt text."""
    rate = daily.pivot(index="day", columns="category", values="success_rate_pct").sort_index()
    rate.index = pd.to_datetime(rate.index)
    fig, ax = plt.subplots(figsize=(11, 4))
    for category in rate.columns:  # matplotlib's dates, not pandas' period axis: the bands land on the days
        ax.plot(rate.index, rate[category], marker=".", label=category)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d"))
    minimum = thresholds["success_rate_min_pct"]
    ax.axhline(minimum, color="red", linestyle="--", linewidth=1, label=f"push-to-main alert below {minimum:g}%")
    notes = _mark_partial_days(ax, [d.date() for d in rate.index], partial)
    ax.set(
        title="Daily success rate by category: finished / (finished + failed + crashed)",
        ylabel="success rate, %",
        xlabel="day of the run's end (UTC)",
        ylim=(0, 105),
    )
    lowest = rate.get("all", pd.Series(dtype=float)).dropna()
    alt = f"Daily success rate per category over {len(rate)} days, with the {minimum:g}% push-to-main alert line."
    if len(lowest):
        alt += f" All runs: lowest {lowest.min():.1f}% on {lowest.idxmin().date()}, last {lowest.iloc[-1]:.1f}%."
    return _finish_daily(fig, ax, alt, notes)


def daily_gpu_hours(daily: pd.DataFrame, partial: dict[date, str]) -> str:
    """GPU-hours per day stacked by category; partial days greyed. Returns the alt text."""
    gpu = (
        daily[daily.category != "all"].pivot(index="day", columns="category", values="gpu_hours").fillna(0).sort_index()
    )
    days = [pd.Timestamp(d).date() for d in gpu.index]
    fig, ax = plt.subplots(figsize=(11, 4))
    gpu.plot(kind="bar", stacked=True, ax=ax, width=0.85)
    notes = _mark_partial_days(ax, days, partial, bars=True)
    ax.set_xticks(range(len(days)), [d.strftime("%m-%d") for d in days], rotation=90)
    ax.set(title="GPU-hours per day by category", ylabel="GPU-hours", xlabel="day (UTC)")
    totals = gpu.sum(axis=1)
    alt = f"GPU-hours per day over {len(days)} days, stacked by category ({', '.join(gpu.columns)})."
    if len(totals):
        alt += f" Busiest day {pd.Timestamp(totals.idxmax()).date()} with {totals.max():,.0f} GPU-hours."
    return _finish_daily(fig, ax, alt, notes)


def unpriced_share(usage: pd.DataFrame) -> tuple[float, float]:
    """``(unpriced %, fallback-priced %)`` of the GPU-hours of ``usage`` (``warehouse.gpu_costs``): those whose cost is
    NULL (no price) and those priced at ``WANDB_ASSETS_GPU_DEFAULT_PRICE`` (``price_basis`` fallback)."""
    total = usage.gpu_hours.sum()
    if not total:
        return 0.0, 0.0
    unpriced = usage.gpu_hours[usage.cost_usd.isna()].sum()
    basis = usage.get("price_basis", pd.Series(index=usage.index, dtype=object))
    fallback = usage.gpu_hours[basis == "fallback"].sum()
    return 100.0 * unpriced / total, 100.0 * fallback / total


def daily_cost_by_team(usage: pd.DataFrame, partial: dict[date, str]) -> str:
    """USD per day stacked by team, partial days greyed, and the share of GPU-hours the dollars leave out stated on
    the chart and in its alt text. ``usage``: ``warehouse.gpu_costs``. Returns the alt text."""
    cost = usage.pivot_table(index="day", columns="team", values="cost_usd", aggfunc="sum").fillna(0).sort_index()
    days = [pd.Timestamp(d).date() for d in cost.index]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    cost.plot(kind="bar", stacked=True, ax=ax, width=0.85)
    notes = _mark_partial_days(ax, days, partial, bars=True)
    ax.set_xticks(range(len(days)), [d.strftime("%m-%d") for d in days], rotation=90)
    unpriced, fallback = unpriced_share(usage)
    left_out = (
        f"{unpriced:.0f}% of GPU-hours have no price and are not counted"
        if unpriced >= 0.5
        else "every GPU-hour is priced"
    )
    if fallback >= 0.5:
        left_out += f"; {fallback:.0f}% at the fallback price"
    ax.set(title=f"GPU cost per day by team, USD ({left_out})", ylabel="USD", xlabel="day (UTC)")
    total = cost.to_numpy().sum()
    alt = (
        f"GPU cost per UTC day over {len(days)} days, stacked by team ({', '.join(map(str, cost.columns))}): "
        f"{total:,.0f} USD in all; {left_out}."
    )
    if len(cost.columns):
        alt += f" The costliest team is {cost.sum().idxmax()} with {cost.sum().max():,.0f} USD."
    fig.text(0.01, -0.02, f"Dollars leave out GPU-hours without a price: {left_out}.", fontsize=9, color="0.3")
    _legend_outside(ax, "team")
    fig.tight_layout()
    alt += "".join(f" {note}." for note in notes)
    show(fig, alt)
    return alt


def team_spend_vs_budget(spend: pd.DataFrame) -> str:
    """The latest month's spend per team as bars against each team's budget (a tick), teams over budget in red, and
    what the dollars leave out. ``spend``: ``warehouse.team_budget_vs_spend``. Returns the alt text."""
    month = spend.month.max()
    latest = spend[spend.month == month].sort_values("spend_usd", ascending=True, na_position="first")
    fig, ax = plt.subplots(figsize=(11, 0.6 * max(len(latest), 3) + 1.5))
    over = latest.over_budget.fillna(False).astype(bool)
    ax.barh(latest.team, latest.spend_usd.fillna(0), color=["tab:red" if o else "tab:blue" for o in over])
    budgeted = latest[latest.budget_usd.notna()]
    ax.scatter(budgeted.budget_usd, budgeted.team, marker="|", s=600, color="black", label="monthly budget")
    label = pd.Timestamp(month).strftime("%Y-%m")
    ax.set(title=f"GPU spend by team in {label} against its budget, USD", xlabel="USD")
    ax.legend(loc="lower right")
    unpriced = latest.unpriced_gpu_hours.sum()
    fig.text(0.01, 0.01, f"Spend leaves out {unpriced:,.0f} GPU-hours without a price.", fontsize=9, color="0.3")
    fig.tight_layout()
    over_names = ", ".join(latest.team[over]) or "none"
    alt = (
        f"GPU spend per team in {label} against each team's monthly budget: {latest.spend_usd.sum():,.0f} USD over "
        f"{len(latest)} teams; over budget: {over_names}; {unpriced:,.0f} GPU-hours have no price and are not in "
        "the dollars."
    )
    show(fig, alt)
    return alt


def _finish_daily(fig: Figure, ax: Axes, alt: str, notes: list[str]) -> str:
    """Legend outside, the partial-day notes appended to the alt text, shown; returns the alt text."""
    _legend_outside(ax, "category")
    fig.tight_layout()
    alt += "".join(f" {note}." for note in notes)
    show(fig, alt)
    return alt


def _when(moment) -> str:
    return "none" if pd.isna(moment) else pd.Timestamp(moment).strftime("%Y-%m-%d %H:%M")


def _nothing(ax: Axes, sentence: str) -> None:
    """An empty chart that says why, in the chart itself (the alt text says it too)."""
    ax.text(0.5, 0.5, "\n".join(textwrap.wrap(sentence, 90)), ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def ci_curves_over_commits(curves: pd.DataFrame, config: str | None, metric: str, missing: str | None = None) -> str:
    """One line per main commit of ``config`` (``warehouse.ci_curves``): ``metric`` by step, the newest darkest,
    each run's steady SPS (median after warm-up) dashed. Without curves, ``missing`` (``warehouse.curves_missing``)
    says why in the chart and its alt text. Returns the alt text."""
    fig, ax = plt.subplots(figsize=(11, 4.5))
    if not len(curves):
        sentence = missing or f"No main-branch run of {config or 'any CI config'} has curves of {metric!r} yet."
        _nothing(ax, sentence)
        ax.set_title(f"{metric} of the last main commits of {config or '(no CI config with curves)'}")
        show(fig, sentence)
        return sentence
    orders = sorted(curves.commit_order.unique()) if len(curves) else []
    colours = plt.cm.viridis_r([0.15 + 0.8 * k / max(len(orders) - 1, 1) for k in range(len(orders))])
    for colour, order in zip(colours, orders, strict=True):
        run = curves[curves.commit_order == order]
        label = f"{run.ci_commit.iloc[0] or run.run_id.iloc[0]}"
        ax.plot(run.step, run.value, color=colour, label=label, linewidth=1.4)
        if pd.notna(run.sps_steady.iloc[0]):
            ax.axhline(run.sps_steady.iloc[0], color=colour, linestyle="--", linewidth=0.8)
    ax.set(
        title=f"{metric} of the last {len(orders)} main commits of {config} (dashed: steady SPS)",
        xlabel="step",
        ylabel=f"{metric} (steps per second)",
    )
    if orders:
        _legend_outside(ax, "commit (oldest to newest)")
    fig.tight_layout()
    steady = curves.drop_duplicates("commit_order").sps_steady.dropna()
    alt = f"{metric} by step for the last {len(orders)} main-branch commits of {config}, one line per commit."
    if len(steady):
        alt += (
            f" Steady SPS ranges from {steady.min():,.0f} to {steady.max():,.0f}; the newest is {steady.iloc[-1]:,.0f}."
        )
    else:
        alt += " No run of it has curves yet."
    show(fig, alt)
    return alt


def steady_sps_by_gpu_model(frame: pd.DataFrame, missing: str | None = None) -> str:
    """Median steady SPS per CI config and GPU model, with the 10th-90th percentile as an error bar
    (``warehouse.steady_sps_by_gpu_model``); without any, ``missing`` says why. Returns the alt text."""
    if not len(frame):
        fig, ax = plt.subplots(figsize=(11, 3))
        sentence = missing or "No run has a steady SPS yet (it comes from the run's curves of WANDB_ASSETS_SPS_METRIC)."
        _nothing(ax, sentence)
        ax.set_title("Steady-state SPS by GPU model, per CI config")
        show(fig, sentence)
        return sentence
    configs = list(dict.fromkeys(frame.ci_config))
    fig, axes = plt.subplots(1, max(len(configs), 1), figsize=(4 * max(len(configs), 1), 4), squeeze=False)
    for ax, config in zip(axes[0], configs, strict=False):
        rows = frame[frame.ci_config == config]
        errors = [rows.median_sps - rows.p10_sps, rows.p90_sps - rows.median_sps]
        ax.barh(rows.gpu_model, rows.median_sps, xerr=errors, color="tab:blue", capsize=3)
        ax.set(title=config, xlabel="steady SPS (median, p10-p90)")
        ax.invert_yaxis()
    fig.suptitle("Steady-state SPS by GPU model, per CI config")
    fig.tight_layout()
    fastest = frame.loc[frame.groupby("ci_config").median_sps.idxmax()] if len(frame) else frame
    alt = f"Median steady-state SPS by GPU model for {len(configs)} CI configs. " + " ".join(
        f"{row.ci_config}: fastest on {row.gpu_model} ({row.median_sps:,.0f} SPS over {row.runs} runs)."
        for row in fastest.itertuples()
    )
    show(fig, alt)
    return alt


def gpu_utilisation_heatmap(frame: pd.DataFrame, hours: int) -> str:
    """Mean GPU utilisation per run (rows) and time bin (columns) over the fleet's last ``hours``
    (``warehouse.gpu_utilisation_by_run``); white where a run had no sample. Returns the alt text."""
    if not len(frame):
        fig, ax = plt.subplots(figsize=(11, 3))
        sentence = (
            "No GPU stream is stored yet: the curves job reads each ended run's GPU stream with its curves "
            "(`uv run wandb-assets curves`)."
        )
        _nothing(ax, sentence)
        ax.set_title(f"GPU utilisation of the busiest runs over the fleet's last {hours} h (UTC)")
        show(fig, sentence)
        return sentence
    grid = frame.pivot(index="run", columns="bin_start", values="util_pct").sort_index()
    fig, ax = plt.subplots(figsize=(11, max(3.0, 0.28 * len(grid) + 1.5)))
    image = ax.imshow(
        grid.to_numpy(dtype=float), aspect="auto", cmap="RdYlGn", vmin=0, vmax=100, interpolation="nearest"
    )
    ax.set_yticks(range(len(grid.index)), grid.index, fontsize=8)
    ticks = list(range(0, len(grid.columns), max(1, len(grid.columns) // 8)))
    ax.set_xticks(ticks, [pd.Timestamp(grid.columns[t]).strftime("%m-%d %H:%M") for t in ticks], rotation=45)
    ax.set(title=f"GPU utilisation of the busiest runs over the fleet's last {hours} h (UTC)", xlabel="time (UTC)")
    fig.colorbar(image, ax=ax, label="mean GPU utilisation, %")
    fig.tight_layout()
    means = frame.groupby("run").util_pct.mean()
    idle = int((means < 5).sum())
    alt = (
        f"Heatmap of mean GPU utilisation for {len(grid)} runs over the last {hours} hours, red idle to green busy; "
        f"{idle} of them averaged under 5% utilisation."
    )
    show(fig, alt)
    return alt
