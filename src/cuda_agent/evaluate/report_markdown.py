"""The Markdown summary of a run (or two side by side): what a validation log or a pull request
quotes. Metrics, fast_p, both TF32 settings, environment, workers and statuses."""

from __future__ import annotations

from cuda_agent.evaluate.metrics import FAST_P_THRESHOLDS, HEADLINE_BASELINES, TF32_BASELINES
from cuda_agent.evaluate.report import ENVIRONMENT_KEYS, RunReport, format_value, metric_rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines + [""]


def _label(group: str, run: RunReport, runs: list[RunReport]) -> str:
    return group if len(runs) == 1 else f"{group} ({run.name})"


def _metric_lines(runs: list[RunReport]) -> list[str]:
    groups = list(dict.fromkeys(name for run in runs for name in run.metrics))
    labels = [label for label, _ in metric_rows(runs[0].metrics["overall"])]
    rows, fast_rows, tf32_rows = [], [], []
    for group in groups:
        for run in runs:
            if group not in run.metrics:
                continue
            metrics = run.metrics[group]
            data = metrics.to_json_dict()
            rows.append([_label(group, run, runs), *(format_value(label, value) for label, value in metric_rows(metrics))])
            for baseline in HEADLINE_BASELINES:
                fast = data[f"fast_p_vs_{baseline}"] or {}
                fast_rows.append([f"{_label(group, run, runs)} vs {baseline}",
                                  *(format_value("", fast.get(f"{p:g}")) for p in FAST_P_THRESHOLDS)])
            for setting in TF32_BASELINES:
                fields = data[setting] or {}
                tf32_rows.append([f"{_label(group, run, runs)} {setting}",
                                  *(format_value(key.split("_")[0], fields.get(key)) for key in (
                                      "faster_rate_vs_eager", "faster_rate_vs_compile",
                                      "geomean_speedup_vs_eager", "geomean_speedup_vs_compile"))])
    return [*_table(["group", *labels], rows),
            "fast_p: correct and speed-up > p, over all tasks.", "",
            *_table(["group", *(f"p={p:g}" for p in FAST_P_THRESHOLDS)], fast_rows),
            "Against the fp32 baselines with TF32 off and on (— : not measured; TF32 exists only on CUDA).", "",
            *_table(["group / baseline", "faster vs eager", "faster vs compile", "geomean vs eager",
                     "geomean vs compile"], tf32_rows)]


def _run_lines(run: RunReport) -> list[str]:
    info = run.run.info
    lines = [f"**{run.name}** — tasks `{info.get('tasks')}`, solutions `{info.get('solutions')}`"
             + (f", policy `{info['policy']}`" if info.get("policy") else "")
             + f", device {info.get('device')}, backend {info.get('backend')}.", "",
             f"Verdicts: {run.protocol}.", ""]
    environment = ", ".join(f"{key} {run.environment[key]}" for key in ENVIRONMENT_KEYS if key in run.environment)
    if environment:
        lines += [f"Environment: {environment}.", ""]
    if run.workers:
        lines += ["Evaluations per worker: " + ", ".join(f"{name}: {count}" for name, count in run.workers.items())
                  + ".", ""]
    lines += ["Statuses: " + ", ".join(f"{name} {count}" for name, count in run.status_counts.items()) + ".", ""]
    return lines


def render_markdown(primary: RunReport, other: RunReport | None) -> str:
    runs = [primary] if other is None else [primary, other]
    title = f"# Evaluation: {primary.name}" + (f" vs {other.name}" if other else "")
    lines = [title, ""]
    for run in runs:
        lines += _run_lines(run)
    if primary.records:
        lines += ["Rates count every task (missing and failed solutions are neither correct nor faster); geometric "
                  "means are over correct tasks; speed-ups against the precision policy's reward baselines.", ""]
        lines += _metric_lines(runs)
    else:
        lines += ["This run has no results yet.", ""]
    return "\n".join(lines).rstrip() + "\n"
