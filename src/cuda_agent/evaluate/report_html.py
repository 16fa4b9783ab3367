"""The HTML report: one self-contained page (inline style and SVG plots), per-level tables,
speed-up distributions, per-task rows linking each solution and its verdict, and the environment."""

from __future__ import annotations

import datetime
from html import escape
from pathlib import Path
from typing import Any

from cuda_agent.evaluate.metrics import FAST_P_THRESHOLDS, HEADLINE_BASELINES, TF32_BASELINES, level_name
from cuda_agent.evaluate.report import (
    ENVIRONMENT_KEYS, RunReport, format_value, metric_rows, relative_link, verdict_file,
)
from cuda_agent.evaluate.store import HARNESS_ERROR, ResultRecord
from cuda_agent.evaluate.svg import histogram_svg

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f2f2f2; }
.correct { color: #1a7f37; } .failed { color: #b42318; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
code { font-size: 12px; }
"""


def _table(header: list[str], rows: list[list[str]], raw: bool = False) -> str:
    """An HTML table; cells are escaped unless ``raw`` (cells built here with their own markup)."""
    cell = (lambda text: text) if raw else escape
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _runs(primary: RunReport, other: RunReport | None) -> list[RunReport]:
    return [primary] if other is None else [primary, other]


def _metrics_section(runs: list[RunReport]) -> str:
    groups = list(dict.fromkeys(name for run in runs for name in run.metrics))
    labels = [label for label, _ in metric_rows(runs[0].metrics["overall"])] if runs[0].metrics else []
    rows = []
    for group in groups:
        for run in runs:
            metrics = run.metrics.get(group)
            values = [format_value(label, value) for label, value in metric_rows(metrics)] if metrics else ["—"] * len(labels)
            rows.append([group + (f" ({run.name})" if len(runs) > 1 else ""), *values])
    fast_rows = []
    for group in groups:
        for run in runs:
            data = run.metrics[group].to_json_dict() if group in run.metrics else {}
            for baseline in HEADLINE_BASELINES:
                fast = data.get(f"fast_p_vs_{baseline}") or {}
                fast_rows.append([f"{group} vs {baseline}" + (f" ({run.name})" if len(runs) > 1 else ""),
                                  *(format_value("", fast.get(f"{p:g}")) for p in FAST_P_THRESHOLDS)])
    return ("<h2>Metrics</h2><p>Rates count every task (missing and failed solutions are not correct and not "
            "faster); geometric means are over correct tasks. Speed-ups are taken against the baselines of the "
            "precision policy's reward.</p>" + _table(["group", *labels], rows)
            + "<h3>fast_p (correct and speed-up &gt; p, over all tasks)</h3>"
            + _table(["group", *(f"p={p:g}" for p in FAST_P_THRESHOLDS)], fast_rows)
            + _tf32_section(runs, groups))


def _tf32_section(runs: list[RunReport], groups: list[str]) -> str:
    rows = []
    for group in groups:
        for run in runs:
            data = run.metrics[group].to_json_dict() if group in run.metrics else {}
            for setting in TF32_BASELINES:
                fields = data.get(setting)
                if fields is None:
                    rows.append([f"{group} {setting}" + (f" ({run.name})" if len(runs) > 1 else ""), *["—"] * 4])
                    continue
                rows.append([f"{group} {setting}" + (f" ({run.name})" if len(runs) > 1 else ""),
                             format_value("rate", fields["faster_rate_vs_eager"]),
                             format_value("rate", fields["faster_rate_vs_compile"]),
                             format_value("geomean", fields["geomean_speedup_vs_eager"]),
                             format_value("geomean", fields["geomean_speedup_vs_compile"])])
    return ("<h3>Against fp32 baselines with TF32 off and on</h3><p>— : not measured (TF32 exists only on CUDA).</p>"
            + _table(["group / baseline", "faster vs eager", "faster vs compile", "geomean vs eager",
                      "geomean vs compile"], rows))


def _plots_section(runs: list[RunReport]) -> str:
    plots = []
    for group in runs[0].metrics:
        for baseline in HEADLINE_BASELINES:
            series = {}
            for run in runs:
                outcomes = [r.outcome() for r in run.records if group in ("overall", level_name(r.level))]
                series[run.name] = [o.speedups[baseline] for o in outcomes if o.correct and baseline in o.speedups]
            if any(series.values()):
                plots.append(histogram_svg(series, f"{group}: speed-up vs {baseline} (correct tasks)"))
    if not plots:
        return "<h2>Speed-up distributions</h2><p>No correct, timed task.</p>"
    return "<h2>Speed-up distributions</h2><div class='plots'>" + "".join(plots) + "</div>"


def _speedup(record: ResultRecord | None, baseline: str) -> str:
    if record is None or not record.correct:
        return "—"
    value = record.outcome().speedups.get(baseline)
    return "—" if value is None else f"{value:.3f}x"


def _ms(record: ResultRecord, field: str) -> str:
    value = (record.verdict or {}).get(field)
    return "—" if value is None else f"{value:.4g}"


def _task_rows(primary: RunReport, other: RunReport | None, folder: Path) -> str:
    others = {r.task_key: r for r in other.records} if other else {}
    header = ["task", "level", "status", "reason", "reward", "candidate ms", "eager ms", "compile ms", "vs eager", "vs compile",
              "worker", "solution", "verdict"]
    if other:
        header += [f"{other.name}: status", f"{other.name}: vs eager", f"{other.name}: vs compile"]
    rows = []
    for record in sorted(primary.records, key=lambda r: (r.level or 0, r.task_key)):
        css = "correct" if record.correct else "failed"
        error = (record.error or "").strip().splitlines()
        status = f"<span class='{css}'>{escape(record.status)}</span>"
        reason = "" if record.correct or not error else escape(
            (error[-1] if error[0].startswith("Traceback") else error[0])[:300])
        solution = (f"<a href='{escape(relative_link(record.solution, folder))}'>{escape(Path(record.solution).name)}</a>"
                    if record.solution else "—")
        verdict = (f"<a href='{escape(relative_link(verdict_file(folder, primary, record), folder))}'>json</a>"
                   if record.verdict else "—")
        # No verdict: a missing solution fails (-1); a harness error is nobody's reward yet.
        reward = str(record.verdict["reward"]) if record.verdict else "—" if record.status == HARNESS_ERROR else "-1"
        row = [escape(record.task_key), escape(str(record.level or "")), status, reason, reward, _ms(record, "candidate_ms"),
               _ms(record, "eager_ms"), _ms(record, "compile_ms"), _speedup(record, "eager"),
               _speedup(record, "compile"), escape(record.worker or "—"), solution, verdict]
        if other:
            match = others.get(record.task_key)
            row += [escape(match.status) if match else "—", _speedup(match, "eager"), _speedup(match, "compile")]
        rows.append(row)
    return "<h2>Tasks</h2>" + _table(header, rows, raw=True)


def _environment_section(runs: list[RunReport]) -> str:
    parts = ["<h2>Environment</h2>"]
    for run in runs:
        info: dict[str, Any] = run.run.info
        created = datetime.datetime.fromtimestamp(run.run.created_at).isoformat(timespec="seconds")
        rows = [["run", run.name], ["started", created], ["store", str(run.store_path)],
                *([key, str(info[key])] for key in ("tasks", "solutions", "policy", "device", "precision", "backend")
                  if info.get(key) is not None),
                ["verdicts", run.protocol],
                *([key, run.environment[key]] for key in ENVIRONMENT_KEYS if key in run.environment)]
        parts.append(_table(["", run.name], rows))
        parts.append(_table(["worker", "evaluations"], [[name, str(count)] for name, count in run.workers.items()]))
        parts.append(_table(["status", "tasks"], [[name, str(count)] for name, count in run.status_counts.items()]))
    return "".join(parts)


def render_html(primary: RunReport, other: RunReport | None, folder: Path) -> str:
    """The whole page for ``primary`` (and ``other`` side by side); links are relative to ``folder``."""
    runs = _runs(primary, other)
    title = f"Evaluation: {primary.name}" + (f" vs {other.name}" if other else "")
    body = [f"<h1>{escape(title)}</h1>"]
    if not primary.records:
        body.append("<p>This run has no results yet.</p>")
    else:
        body += [_metrics_section(runs), _plots_section(runs), _task_rows(primary, other, folder)]
    body.append(_environment_section(runs))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n")
