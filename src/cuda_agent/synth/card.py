"""The dataset card: its numbers, and the markdown (``README.md``) they are shown in.

Every run writes the card from the journal alone (:func:`card_numbers`); ``cuda-agent synth card``
(:mod:`cuda_agent.synth.full_card`) adds what takes measuring or extra sources: how the set was made
(the run records), input sizes, diversity, op-family coverage beside the seed-op list, the
decontamination report, ``tasks check`` counts and the histograms. A section whose numbers are absent
is left out, and the card says which command adds it.
"""

from __future__ import annotations

import datetime
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cuda_agent.synth.diversity import op_sequence_cap
from cuda_agent.synth.records import Rejection, TaskRecord

PARQUET = "tasks.parquet"
INSTALL_PARQUET = "pip install 'cuda-agent[parquet]'"
FULL_CARD_SECTIONS = ("runs", "input_sizes", "coverage", "diversity", "decontamination")
"""Numbers only ``cuda-agent synth card`` computes; without them the card points to it."""


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def card_numbers(accepted: Sequence[TaskRecord], rejected: Sequence[Rejection], meta: Mapping[str, Any],
                 families: Mapping[str, str] | None, files: list[str], capped: int = 0,
                 journaled: bool = True) -> dict[str, Any]:
    """The card's numbers from the journal's decisions.

    Args:
        accepted: the tasks in the dataset (after the op-sequence cap).
        rejected: every rejection, as journaled.
        meta: ``meta.json``'s settings with ``created``; empty for a bare data file.
        families: operator -> family, or ``None``.
        files: the data files written.
        capped: accepted tasks the op-sequence cap left out of the files.
        journaled: the decisions come from a journal (else from a bare data file: no rejections known).
    """
    funnel: dict[str, Counter[str]] = {}
    for entry in rejected:
        funnel.setdefault(entry.stage, Counter())[entry.reason] += 1
    per_family: Counter[str] = Counter()
    if families is not None:
        for record in accepted:
            per_family.update({families.get(op, "unknown") for op in record.ops})
    return {
        "tasks": len(accepted),
        "files": files,
        "ops_per_task": dict(sorted(Counter(len(record.ops) for record in accepted).items())),
        "tasks_per_family": dict(sorted(per_family.items(), key=lambda item: (-item[1], item[0]))),
        "decided": len(accepted) + capped + len(rejected),
        "rejected": {stage: dict(sorted(reasons.items())) for stage, reasons in funnel.items()},
        "capped": capped,
        "eager_ms": _summary([r.eager_ms for r in accepted if r.eager_ms is not None]),
        "compile_ms": _summary([r.compile_ms for r in accepted if r.compile_ms is not None]),
        "devices": dict(sorted(Counter(str(record.device) for record in accepted).items())),
        "composers": dict(sorted(Counter(record.composer for record in accepted).items())),
        "transformers": sum(record.source == "transformers" for record in accepted),
        "journaled": journaled,
        "run": dict(meta),
    }


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table: the first column and text columns left-aligned, number columns right-aligned."""
    rows = [list(row) for row in rows]
    numeric = [index > 0 and all(isinstance(row[index], (int, float)) or str(row[index]).rstrip(" %").replace(".", "")
                                 .isdigit() for row in rows) for index in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "".join("---:|" if number else "---|" for number in numeric)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _ms(summary: Mapping[str, float]) -> str:
    if not summary:
        return "not measured"
    return " / ".join(f"{summary[key]:.4g}" for key in ("min", "median", "max")) + " ms"


def _share(count: int, total: int) -> str:
    return f"{count} ({100 * count / total:.1f} %)" if total else str(count)


def _settings(numbers: Mapping[str, Any]) -> str:
    run = numbers["run"]
    window = run.get("eager_window_ms")
    gpus = sorted({gpu for record in numbers.get("runs", []) for gpu in record.get("machine", {}).get("gpus", [])})
    rows = [("device", run.get("device", "unknown") + (f" ({', '.join(gpus)})" if gpus else "")),
            ("times measured on (tasks)", "; ".join(
                f"{device}{' (the synthesis filter)' if device == run.get('device') else ''}: {count}"
                for device, count in numbers["devices"].items()) or "none"),
            ("eager time window", f"{window[0]:g} - {window[1]:g} ms" if window else "unknown"),
            ("eager time (min / median / max)", _ms(numbers["eager_ms"])),
            ("torch.compile time (min / median / max)", _ms(numbers["compile_ms"])),
            ("size bound (inputs of one task)",
             f"{run['max_input_mb']:g} MiB" if "max_input_mb" in run else "not recorded"),
            ("op-sequence cap (share of the set)", f"{run['max_op_sequence_share']:g}"
             if "max_op_sequence_share" in run else "not recorded"),
            ("seed_ops_version", run.get("seed_ops_version", "unknown")),
            ("torch", run.get("torch_version", "unknown")),
            ("created", run.get("created", "unknown"))]
    return "| setting | value |\n|---|---|\n" + "\n".join(f"| {key} | {value} |" for key, value in rows)


def _runs_section(runs: Sequence[Mapping[str, Any]]) -> str:
    if not runs:
        return ("## How it was made\n\nThis directory has no run records (`runs.jsonl`, written by every `cuda-agent "
                "synth run` since they were introduced), so the commands, machine and hours are not recorded here.\n")
    rows = []
    for record in runs:
        machine = record.get("machine", {})
        gpus = machine.get("gpus", [])
        where = (f"{len(gpus)} x {gpus[0]}" if gpus else "CPU") + f", {machine.get('cpus', '?')} cores"
        started = datetime.datetime.fromtimestamp(record["started"], datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
        this = record["this_run"]
        rows.append((started, f"`{record.get('command') or 'library call'}`", where, f"{this['seconds'] / 60:.1f}",
                     this["composed"], this["decided"], this["accepted"], f"{this['accepted_per_minute']:.1f}"))
    wall_h = sum(record["this_run"]["seconds"] for record in runs) / 3600
    gpu_h = sum(record["this_run"]["seconds"] * max(1, len(record.get("machine", {}).get("gpus", [])))
                for record in runs) / 3600
    return ("## How it was made\n\n"
            + _table(("started (UTC)", "command", "machine", "minutes", "composed", "decided", "accepted",
                      "accepted / min"), rows)
            + f"\n\n{len(runs)} calls, {wall_h:.2f} hours in all ({gpu_h:.2f} GPU-hours counting every GPU of a call; "
            "CPU calls count as one).\n")


def _ops_section(numbers: Mapping[str, Any]) -> str:
    text = "## Fused operators per task\n\n" + _table(("ops", "tasks"), numbers["ops_per_task"].items())
    plots = numbers.get("plots", {})
    if "ops_per_task" in plots:
        text += f"\n\n![fused operators per task]({plots['ops_per_task']})"
    if "eager_ms" in plots:
        text += f"\n\n![eager time per task]({plots['eager_ms']})"
    return text + "\n"


def _input_section(sizes: Mapping[str, Any]) -> str:
    if sizes["bound_recorded"]:
        bound = (f"The size bound is {sizes['bound_mb']:g} MiB: the composer scales a larger task's batch-like size "
                 "constants down, it does not drop it.")
    else:
        bound = (f"This set was made before the size bound was recorded; it is counted against the default bound, "
                 f"{sizes['bound_mb']:g} MiB.")
    text = (f"## Input sizes\n\nBytes of one task's `get_inputs()`, measured without allocating them (read from the "
            f"source, or `get_inputs()` run on the meta device). {bound}\n\n")
    text += _table(("inputs", "tasks"), sizes["buckets"])
    text += (f"\n\nMin / median / max: {sizes['min_mb']:.4g} / {sizes['median_mb']:.4g} / {sizes['max_mb']:.4g} MiB; "
             f"{sizes['at_least_1gib']} tasks at 1 GiB or more; {sizes['over_bound']} over the bound.")
    if sizes.get("resized") is not None:
        text += f" {sizes['resized']} composed tasks were resized to fit the bound."
    if sizes.get("unmeasured"):
        text += f" {sizes['unmeasured']} tasks could not be measured (their `get_inputs()` failed here)."
    return text + "\n"


def _families_section(numbers: Mapping[str, Any]) -> str:
    coverage = numbers.get("coverage")
    if coverage:
        rows = [(row["family"], row["seed_ops"], row["ops_used"],
                 f"{100 * row['ops_used'] / row['seed_ops']:.0f} %" if row["seed_ops"] else "-", row["tasks"])
                for row in coverage]
        return ("## Operator families and coverage\n\n"
                + _table(("family", "seed ops", "seed ops used", "coverage", "tasks"), rows)
                + "\n\nA task counts once in every family it has an operator of; `seed ops` is the family's size in "
                  "the seed-op catalogue the run mined (`seed_ops.json`).\n")
    if numbers["tasks_per_family"]:
        return ("## Operator families\n\n" + _table(("family", "tasks"), numbers["tasks_per_family"].items())
                + "\n\nA task counts once in every family it has an operator of.\n")
    return "## Operator families\n\nNo operator -> family map was given.\n"


def _diversity_section(numbers: Mapping[str, Any]) -> str:
    diversity, tasks = numbers["diversity"], numbers["tasks"]
    share = numbers["run"].get("max_op_sequence_share")
    cap = (f"at most {op_sequence_cap(share, tasks)} tasks ({share:g} of the set); {numbers['capped']} accepted "
           "tasks were left out by it" if share else "not recorded (the set predates it)")
    largest = diversity["largest_op_sequence"]
    most = ("each occurs once" if largest["tasks"] <= 1 else
            f"the most frequent, `{' -> '.join(largest['ops'])}`, has {largest['tasks']}")
    lines = [f"- {diversity['op_sequences']} distinct operator sequences over {tasks} tasks; {most}.",
             f"- Op-sequence cap: {cap}.",
             f"- Near-duplicate clusters (same operator sequence, input shapes the same up to scale: the same ranks, "
             f"sizes differing along one axis at most): {diversity['clusters']} clusters holding "
             f"{diversity['tasks_in_clusters']} tasks; the largest has {diversity['largest_cluster']}."]
    return "## Diversity\n\n" + "\n".join(lines) + "\n"


def _funnel_section(numbers: Mapping[str, Any]) -> str:
    if "sample_of" in numbers:
        source = numbers["sample_of"]
        return (f"## Filter funnel\n\nA sample of {numbers['tasks']} of the {source['tasks']} tasks of "
                f"`{source['path']}`: equal shares per number of fused ops, each share the first tasks in `id` order "
                "(content-hash order, so deterministic and unrelated to the task). The source's card has its filter "
                "funnel.\n")
    funnel = [(f"{stage}: {reason}", count) for stage, reasons in numbers["rejected"].items()
              for reason, count in reasons.items()]
    if not numbers["journaled"]:
        return ("## Filter funnel\n\nNot recorded: this directory holds no journal (`journal.jsonl`), so the "
                "rejections per rule are unknown here.\n")
    capped = (f" {numbers['capped']} more were accepted and left out by the op-sequence cap." if numbers.get("capped")
              else "")
    return (f"## Filter funnel\n\n{numbers['decided']} tasks decided, {numbers['tasks']} in the set.{capped}\n\n"
            + _table(("stage: reason", "rejected"), funnel) + "\n")


def _checks_section(checks: Mapping[str, Any] | None) -> str:
    if checks is None:
        return ("## Judged-ready (`tasks check`)\n\nNot run on this set: no `tasks check` results were given "
                "(`cuda-agent synth card DIR --checks RESULTS`).\n")
    rows = sorted(checks["statuses"].items())
    withdrawn = checks["withdrawn"]
    return (f"## Judged-ready (`tasks check`)\n\nEach task's reference run as its own candidate through the full "
            f"verdict (`{checks['path']}`): {checks['correct']} `correct` of {_tasks(checks['checked'])} checked; "
            f"{_tasks(checks['not_checked'])} of the set without a result. Withdrawn from the set for not coming "
            f"out `correct`: {_tasks(len(withdrawn))} (`cuda-agent synth apply-checks`; journaled as `self_check` "
            f"rejections). The `eager_ms` and `compile_ms` of {_tasks(checks['timed_by_check'])} are their "
            "check's (the verdict's timing protocol, TF32 off); the rest are the synthesis filter's.\n\n"
            + _table(("status", "tasks"), rows) + "\n"
            + _failed_checks("Not `correct`, in the set", checks["failed"])
            + _failed_checks("Withdrawn by their check", withdrawn) + _outside_window(checks["outside_window"]))


def _tasks(count: int) -> str:
    return f"{count} task" if count == 1 else f"{count} tasks"


def _outside_window(tasks: Sequence[Mapping[str, Any]]) -> str:
    """``correct`` tasks whose check timed their eager pass outside the window the filter kept
    them in (the filter's timing protocol is shorter than the verdict's): kept, and listed."""
    if not tasks:
        return ""
    rows = [(f"`{row['task']}`", f"{row['eager_ms']:.4g}") for row in tasks]
    return ("\n`correct`, but their check timed the eager pass outside the eager-time window (kept in the set):\n\n"
            + _table(("task", "eager ms (check)"), rows) + "\n")


def _failed_checks(title: str, failed: Sequence[Mapping[str, Any]]) -> str:
    """Checked tasks that are not ``correct``, each with the first line of its error."""
    if not failed:
        return ""
    rows = [(f"`{row['task']}`", row["status"], next(iter((row["error"] or "").splitlines()), "")[:160].replace("|", "\\|"))
            for row in failed]
    return f"\n{title}:\n\n" + _table(("task", "status", "error (first line)"), rows) + "\n"


def _decontamination_section(report: Mapping[str, Any]) -> str:
    rows = [(level, entry["files"], entry["withdrawn"], entry["matches_now"], entry["close"])
            for level, entry in report["levels"].items()]
    threshold, close = report["threshold"], report["close_threshold"]
    return ("## Decontamination\n\n"
            f"Against `{report['benchmark']}`: a task is withdrawn at normalised-AST similarity >= {threshold:g} to a "
            "benchmark file (names, formatting and every size abstracted away, so a benchmark problem at any size "
            "counts).\n\n"
            + _table(("benchmark part", "files", "withdrawn during synthesis", f"in the set at >= {threshold:g} now",
                      f"in the set at {close:g}-{threshold:g}"), rows)
            + "\n")


def _differences_section(numbers: Mapping[str, Any]) -> str:
    composers = ", ".join(f"`{name}` {count}" for name, count in numbers.get("composers", {}).items()) or "unknown"
    run = numbers["run"]
    seed_ops = sum(row["seed_ops"] for row in numbers.get("coverage") or [])
    catalogue = f" ({seed_ops} operators in the catalogue)" if seed_ops else ""
    sizes = numbers.get("input_sizes")
    if sizes:
        size_line = f"median input {sizes['median_mb']:.4g} MiB, bound {sizes['bound_mb']:g} MiB"
    else:
        size_line = f"inputs bounded at {run['max_input_mb']:g} MiB" if "max_input_mb" in run else "bound not recorded"
    return f"""## Columns and differences from CUDA-Agent-Ops-6K

- Composer: {composers} (`deterministic`: cuda-agent's seeded, shape-aware composer, no LLM;
  `llm:<model>`: an LLM composing the operators that composer sampled). The paper's Ops-6K was
  composed by an LLM.
- Seed operators: mined by introspection of torch and transformers{catalogue}, not the
  paper's list. {_share(numbers.get('transformers', 0), numbers['tasks'])} tasks build a module from `transformers` and
  need it to load (`pip install 'cuda-agent[hf]'`).
- Sizes: {size_line}; the composer scales sizes in powers of two until the eager time
  lands inside the window.
- `data_source` is `<seed source>#<number of fused operators>` (`torch#3`, `transformers#5`), the
  Ops-6K convention; many rows share a value, so it is not an id. `id` is the content hash of
  `code`; `ops`, `code` as in Ops-6K; `eager_ms`, `compile_ms`, `device`, `seed_ops_version`,
  `composer`, `seed`, `source` are ours. `device` names what measured the row's times: the GPU
  model of its self-check, else the synthesis filter's device (the runs above name its GPUs).
- Filter: eager and `torch.compile` must run, be deterministic and not degenerate, with the eager
  time inside the window above (the paper's window on CUDA is 1-100 ms), and near-copies of
  KernelBench problems are withdrawn, as in the paper; the thresholds are cuda-agent's own.
- `cuda-agent tasks list FILE --failed` lists rows that fail to load and why; loaders key rows by
  `id` (row index where a table has no `id`, as Ops-6K has none).
"""


def render_card(numbers: Mapping[str, Any]) -> str:
    """The dataset card (``README.md``) for :func:`card_numbers` (plus, from ``synth card``, the
    keys of :data:`FULL_CARD_SECTIONS`, ``checks`` and ``plots``)."""
    parquet_note = ("" if PARQUET in numbers["files"] else
                    f"\n`{PARQUET}` was not written: pyarrow is not installed ({INSTALL_PARQUET}).\n")
    sections = [f"""# Synthesised CUDA kernel tasks

{numbers['tasks']} tasks in KernelBench format (`class Model`, `get_inputs`, `get_init_inputs`),
composed from seed operators and kept after the execution filter, de-contamination and
de-duplication by `cuda-agent synth`. Files: {', '.join(f'`{name}`' for name in numbers['files'])}
(the same rows, sorted by `id`, the content hash of `code`).
{parquet_note}
{_settings(numbers)}
"""]
    if "runs" in numbers:
        sections.append(_runs_section(numbers["runs"]))
    sections.append(_ops_section(numbers))
    if "input_sizes" in numbers:
        sections.append(_input_section(numbers["input_sizes"]))
    sections.append(_families_section(numbers))
    if "diversity" in numbers:
        sections.append(_diversity_section(numbers))
    sections.append(_funnel_section(numbers))
    if "checks" in numbers:
        sections.append(_checks_section(numbers["checks"]))
    if "decontamination" in numbers:
        sections.append(_decontamination_section(numbers["decontamination"]))
    sections.append(_differences_section(numbers))
    if "sample_of" not in numbers and not all(key in numbers for key in FULL_CARD_SECTIONS):
        sections.append("How it was made, input sizes, diversity, op-family coverage and the decontamination report "
                        "are added by `cuda-agent synth card DIR` (see docs/synth.md).\n")
    return "\n".join(sections)
