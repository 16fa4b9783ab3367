"""Reports of an evaluation run: the data they show, and writing them next to the run.

``write_reports`` writes ``report.html`` (self-contained: styles and plots inline), ``summary.md``
and, for the per-task links, each verdict as ``verdicts/<run>/<task>.json``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.evaluate.metrics import GroupMetrics, benchmark_metrics
from cuda_agent.evaluate.store import ResultRecord, ResultsStore, RunInfo

ENVIRONMENT_KEYS = ("gpu", "driver", "cuda", "capability", "torch", "python", "cpu", "threads")
"""Verdict environment entries shown in reports, in this order."""


@dataclass(frozen=True)
class RunReport:
    """Everything a report shows about one run."""

    name: str
    store_path: Path
    run: RunInfo
    records: list[ResultRecord]
    metrics: dict[str, GroupMetrics]
    environment: dict[str, str]  # the environment most verdicts report
    workers: dict[str, int]  # evaluations answered per worker (GPU lane, CPU lane, Ray actor)

    @property
    def protocol(self) -> str:
        """The preset and verdict rules of the run (``presets.describe``), from its stored settings."""
        from cuda_agent.environment import ConfigError, EvalConfig
        from cuda_agent.environment.presets import describe

        try:
            return describe(EvalConfig.from_dict(self.run.settings.get("evaluation") or {}))
        except (ConfigError, TypeError, ValueError) as exc:
            return f"settings unreadable ({exc})"

    @property
    def status_counts(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.records).most_common())


def load_run_report(path: Path, run_id: str | None = None) -> RunReport:
    """Read a run from its folder (or store file).

    Raises:
        StoreError: no store, no such run, or several runs and no ``run_id``.
    """
    store = ResultsStore.open_existing(path)
    try:
        run = store.run(run_id)
        records = store.records(run.run_id)
    finally:
        store.close()
    environments = Counter(json.dumps({k: r.verdict["environment"][k] for k in ENVIRONMENT_KEYS
                                       if k in r.verdict["environment"]}, sort_keys=True)
                           for r in records if r.verdict and r.verdict.get("environment"))
    environment = json.loads(environments.most_common(1)[0][0]) if environments else {}
    workers = Counter(r.worker for r in records if r.worker)
    metrics = benchmark_metrics([r.outcome() for r in records]) if records else {}
    return RunReport(run.run_id, store.path, run, records, metrics, environment, dict(sorted(workers.items())))


def verdict_file(folder: Path, report: RunReport, record: ResultRecord) -> Path:
    return folder / "verdicts" / report.name / f"{record.task_key}.json"


def relative_link(target: str | Path, folder: Path) -> str:
    """A link from a page in ``folder`` to ``target`` (relative when both are on one filesystem tree)."""
    try:
        return Path(os.path.relpath(Path(target).resolve(), folder.resolve())).as_posix()
    except ValueError:
        return Path(target).resolve().as_uri()


def write_reports(primary: RunReport, other: RunReport | None, folder: Path) -> tuple[Path, Path]:
    """Write ``report.html``, ``summary.md`` and the verdict files into ``folder``.

    Returns:
        The paths of the HTML page and the Markdown summary.
    """
    from cuda_agent.evaluate.report_html import render_html
    from cuda_agent.evaluate.report_markdown import render_markdown

    folder.mkdir(parents=True, exist_ok=True)
    for report in (primary, other):
        for record in (report.records if report else []):
            if record.verdict is not None:
                path = verdict_file(folder, report, record)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(record.verdict, indent=1, allow_nan=False))
    html_path, markdown_path = folder / "report.html", folder / "summary.md"
    html_path.write_text(render_html(primary, other, folder))
    markdown_path.write_text(render_markdown(primary, other))
    return html_path, markdown_path


def metric_rows(group: GroupMetrics) -> list[tuple[str, Any]]:
    """``(label, value)`` of a group's headline metrics, in report order (rates as fractions)."""
    data = group.to_json_dict()
    rows: list[tuple[str, Any]] = [("tasks", group.n_tasks), ("missing solutions", group.n_missing),
                                   ("pass rate", group.pass_rate)]
    for label, key in (("faster than eager", "faster_rate_vs_eager"), ("faster than compile", "faster_rate_vs_compile"),
                       ("geomean speed-up vs eager", "geomean_speedup_vs_eager"),
                       ("geomean speed-up vs compile", "geomean_speedup_vs_compile")):
        rows.append((label, data[key]))
    return rows


def format_value(label: str, value: Any) -> str:
    if value is None:
        return "—"
    if label.startswith("geomean"):
        return f"{value:.3f}x"
    if isinstance(value, float):
        return f"{100 * value:.1f}%"
    return str(value)
