"""``cuda-agent synth``: mine seed operators, compose tasks, filter them into a dataset."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import typer
from rich.progress import Progress

from cuda_agent.cli_output import CliApp, WrappingTable, step_progress
from cuda_agent.cli_support import console, default_device, err_console, fail_usage
from cuda_agent.synth.records import SEED_OPS

synth_app = CliApp(no_args_is_help=True,
                   help="Data synthesis: seed operators -> composed tasks -> filtered, de-contaminated dataset.")



def _progress_bars(disable: bool = False) -> tuple[Progress, Callable[[str, int, int], None]]:
    """A rich progress display and the ``progress(stage, done, total)`` callback that drives it."""
    progress = step_progress(disable=disable)
    bars: dict[str, int] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in bars:
            bars[stage] = progress.add_task(stage, total=total)
        progress.update(bars[stage], completed=done, total=total)

    return progress, update


def _load_or_mine(catalogue: Optional[Path], cache: Optional[Path], transformers: bool):
    from cuda_agent.synth.mining import load_catalogue, mine_seed_ops, save_catalogue

    path = catalogue or cache
    if path is not None and path.exists():
        try:
            return load_catalogue(path)
        except ValueError as exc:
            fail_usage(str(exc))
    if catalogue is not None:
        fail_usage(f"{catalogue}: no such seed catalogue (make one with `cuda-agent synth seeds`)")
    progress, update = _progress_bars()
    with progress:
        mined = mine_seed_ops(include_transformers=transformers, progress=lambda done, total: update("mining seed operators", done, total))
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        save_catalogue(mined, cache)
    return mined


def _window(window: Optional[tuple[float, float]]) -> Optional[tuple[float, float]]:
    return None if window is None or window == (0.0, 0.0) else window


def _composer(catalogue, device: str, window: Optional[tuple[float, float]], n_ops: Optional[int],
              llm: bool, llm_base_url: Optional[str], llm_model: Optional[str], max_input_mb: Optional[float] = None):
    """``seed -> TaskRecord``: the deterministic composer (sizing tasks up to the size bound
    ``max_input_mb``, default when ``None``), or the LLM composing the operators the deterministic
    composer sampled for that seed."""
    if not llm:
        from cuda_agent.synth.composer import DeterministicComposer
        from cuda_agent.synth.filter import DEFAULT_WINDOWS_MS
        from cuda_agent.synth.input_size import DEFAULT_MAX_INPUT_MB

        return DeterministicComposer(catalogue, n_ops, target_ms=window or DEFAULT_WINDOWS_MS[device], device=device,
                                     max_input_mb=max_input_mb or DEFAULT_MAX_INPUT_MB)
    from cuda_agent.synth.llm_composer import LLMConfig, SampledChainComposer

    try:
        return SampledChainComposer(catalogue, LLMConfig.from_env(base_url=llm_base_url, model=llm_model), n_ops)
    except ValueError as exc:
        fail_usage(str(exc))


_COMPOSER_OPTIONS = dict(
    n_ops=typer.Option(None, help="Operators fused into each task, 1-5 (default: drawn per seed)."),
    llm=typer.Option(False, "--llm/--no-llm", help="Compose with an LLM through an OpenAI-compatible endpoint."),
    llm_base_url=typer.Option(None, help="Endpoint base URL (default: $CUDA_AGENT_LLM_BASE_URL, $OPENAI_BASE_URL)."),
    llm_model=typer.Option(None, help="Model name (default: $CUDA_AGENT_LLM_MODEL). The key comes from "
                                      "$CUDA_AGENT_LLM_API_KEY or $OPENAI_API_KEY."),
)


def _families(catalogue) -> dict[str, str]:
    return {op.name: op.family for op in catalogue.ops}


@synth_app.command("seeds")
def seeds(
    out: Path = typer.Option(Path(SEED_OPS), help="Where to write the seed catalogue (JSON)."),
    transformers: bool = typer.Option(True, "--transformers/--no-transformers",
                                      help="Also mine transformers building blocks (when transformers is installed)."),
) -> None:
    """Discover operators in torch (and transformers) by introspection, probe them, save the catalogue."""
    if out.exists():
        out.unlink()
    catalogue = _load_or_mine(None, out, transformers)
    table = WrappingTable(title=f"{len(catalogue.ops)} seed operators -> {out}")
    table.add_column("family")
    table.add_column("torch", justify="right")
    table.add_column("transformers", justify="right")
    counts: dict[str, dict[str, int]] = {}
    for op in catalogue.ops:
        counts.setdefault(op.family, {}).setdefault(op.source, 0)
        counts[op.family][op.source] += 1
    for family in sorted(counts):
        table.add_row(family, str(counts[family].get("torch", 0)), str(counts[family].get("transformers", 0)))
    console.print(table)
    for note in catalogue.notes:
        console.print(f"note: {note}")


@synth_app.command("compose")
def compose_command(
    n: int = typer.Option(..., "--n", help="Number of tasks to compose (composer seeds first-seed .. first-seed+n-1)."),
    out: Path = typer.Option(Path("composed.jsonl"), help="JSONL file of composed tasks (appended to)."),
    catalogue: Optional[Path] = typer.Option(None, help=f"Seed catalogue (default: mine one into ./{SEED_OPS})."),
    first_seed: int = typer.Option(0, help="First composer seed."),
    n_ops: Optional[int] = _COMPOSER_OPTIONS["n_ops"],
    llm: bool = _COMPOSER_OPTIONS["llm"],
    llm_base_url: Optional[str] = _COMPOSER_OPTIONS["llm_base_url"],
    llm_model: Optional[str] = _COMPOSER_OPTIONS["llm_model"],
    device: Optional[str] = typer.Option(None, help="Device the sizes are tuned for (default: cuda if visible, else cpu)."),
    window: Optional[tuple[float, float]] = typer.Option(None, help="Target eager time LOW HIGH in ms (default per device)."),
    workers: int = typer.Option(2, help="Composer processes (or LLM requests in flight) at once."),
) -> None:
    """Compose tasks (deterministic, shape-aware composer, or --llm) and append them to a JSONL file."""
    from cuda_agent.synth.compose_workers import compose_parallel

    if n < 1 or workers < 1:
        fail_usage(f"--n and --workers must be >= 1, got {n} and {workers}")
    device = device or default_device()
    cat = _load_or_mine(catalogue, None if catalogue else Path(SEED_OPS), True)
    composer = _composer(cat, device, _window(window), n_ops, llm, llm_base_url, llm_model)
    progress, update = _progress_bars()
    made = failed = 0
    with progress, open(out, "a", encoding="utf-8") as f:
        for i, entry in enumerate(compose_parallel(composer, list(range(first_seed, first_seed + n)), workers)):
            if "record" in entry:
                f.write(json.dumps(entry["record"]) + "\n")
                made += 1
            else:
                err_console.print(f"seed {entry['seed']}: {entry['error']}")
                failed += 1
            update("composing", i + 1, n)
    console.print(f"{made} tasks appended to {out}" + (f"; {failed} seeds failed" if failed else ""))


def _filter_options(arguments: dict) -> dict:
    """A command's values of the shared options (:data:`_FILTER_OPTIONS`), from its ``locals()``."""
    return {name: arguments[name] for name in _FILTER_OPTIONS}


def _run_config(n: int, first_seed: int, options: dict):
    """The pipeline config from the shared filter options (:data:`_FILTER_OPTIONS`)."""
    from cuda_agent.synth.filter import FilterConfig
    from cuda_agent.synth.pipeline import RunConfig

    listed = options["devices"]
    devices = None if listed is None else tuple(entry.strip() for entry in listed.split(",") if entry.strip())
    try:
        filter_config = FilterConfig(device=options["device"] or default_device(), window_ms=_window(options["window"]),
                                     compile=options["compile_check"], max_memory_mb=options["max_memory_mb"],
                                     restart_every=options["restart_every"])
        bounds = {name: options[name] for name in ("max_input_mb", "max_op_sequence_share")
                  if options[name] is not None}
        return RunConfig(n=n, first_seed=first_seed, workers=options["workers"], benchmark=options["benchmark"],
                         similarity=options["similarity"], filter=filter_config, devices=devices,
                         compose_workers=options["compose_workers"], batch_size=options["batch"], **bounds,
                         time_limit_s=None if options["time_limit"] is None else options["time_limit"] * 60)
    except ValueError as exc:
        fail_usage(str(exc))


def _batch_line(status) -> None:
    """One progress line per batch of filter decisions (any output, terminal or log)."""
    devices = ", ".join(f"{name} {int(counts.get('accepted', 0))}/{int(counts.get('decided', 0))} "
                        f"lock {100 * counts.get('lock_s', 0.0) / status.elapsed_s:.0f}%"
                        for name, counts in status.per_device.items())
    err_console.print(f"[{status.elapsed_s:7.1f} s] accepted {status.accepted} of {status.decided} decided "
                      f"({status.accepted_per_minute:.1f}/min); composed {status.composed}/{status.seeds}, "
                      f"screened {status.screened}, queued {status.queued}, checking {status.filtering}"
                      + (f"; {devices}" if devices else ""), markup=False, highlight=False, soft_wrap=True)


def _run_pipeline(config, out: Path, composer, families) -> None:
    from cuda_agent.synth.dataset import DatasetError
    from cuda_agent.synth.pipeline import run

    progress, update = _progress_bars(disable=not err_console.is_terminal)  # elsewhere: the batch lines only
    command = shlex.join(["cuda-agent", *sys.argv[1:]])
    try:
        with progress:
            numbers = run(config, out, composer, families=families, progress=update, on_batch=_batch_line,
                          command=command)
    except KeyboardInterrupt:
        err_console.print(f"interrupted: every decision so far is saved in {out}; run the same command to resume")
        raise typer.Exit(130) from None
    except (DatasetError, ValueError) as exc:
        fail_usage(str(exc))
    _print_stats(numbers, out)
    this_run = numbers["this_run"]
    console.print(f"this run: {this_run['accepted']} accepted of {this_run['decided']} decided in "
                  f"{this_run['seconds']:.0f} s ({this_run['accepted_per_minute']:.1f} accepted/min)")
    for name, counts in this_run["per_device"].items():
        console.print(f"  {name}: {int(counts.get('accepted', 0))} accepted of {int(counts.get('decided', 0))}, "
                      f"measurement lock held {counts.get('lock_s', 0.0):.0f} s of {this_run['seconds']:.0f}")
    if this_run["filter_lane_seconds"]:
        console.print("filter time per step, summed over lanes: " + ", ".join(
            f"{step} {seconds:.0f} s" for step, seconds in sorted(this_run["filter_lane_seconds"].items())))
    if numbers["pending"]:
        console.print(f"time limit reached: {numbers['pending']} composer seeds are not decided yet; "
                      "run the same command to resume")


_FILTER_OPTIONS = dict(
    device=typer.Option(None, help="cuda or cpu (default: cuda if a GPU is visible, else cpu)."),
    window=typer.Option(None, help="Accepted eager time LOW HIGH in ms (default: 1 100 on cuda, 0.5 1000 on cpu)."),
    workers=typer.Option(2, help="Filter lanes (worker processes), spread over --devices."),
    compose_workers=typer.Option(None, help="Composer processes (or LLM requests in flight), running beside the "
                                            "filter (default: a quarter of --workers, at least 1)."),
    devices=typer.Option(None, help="Devices the lanes are spread over, comma-separated: on cuda, GPUs as "
                                    "CUDA_VISIBLE_DEVICES entries (default: every visible GPU); on cpu, lane groups "
                                    "cpu:0,cpu:1,... (default: one)."),
    max_input_mb=typer.Option(None, help="The size bound: most MiB one task's inputs may take; a larger task is "
                                         "scaled down (default: 1024)."),
    max_op_sequence_share=typer.Option(None, help="Most of the dataset one operator sequence may hold "
                                                  "(default: 0.005)."),
    batch=typer.Option(100, help="Filter decisions per progress line."),
    compile_check=typer.Option(True, "--compile/--no-compile", help="Require torch.compile to work and record compile_ms."),
    benchmark=typer.Option(None, help="Benchmark folder (e.g. a KernelBench checkout) to de-contaminate against."),
    similarity=typer.Option(0.9, help="Normalised-AST similarity at which a task counts as a copy."),
    max_memory_mb=typer.Option(None, help="Most memory (MB) one forward pass may need (default: 4096 on cuda, "
                                          "16384 on cpu); on a GPU, workers x this must fit its memory."),
    restart_every=typer.Option(1, help="Tasks a filter worker checks before a fresh one starts (1: every task in a "
                                       "clean process; more saves a worker start and torch.compile's warm-up)."),
    time_limit=typer.Option(None, "--time-limit-min", "--time-limit",
                            help="In minutes: no new work starts after it; what was decided is written and the same "
                                 "command resumes."),
)


@synth_app.command("filter")
def filter_command(
    composed: Path = typer.Argument(..., help="JSONL of composed tasks (from `synth compose`) or a dataset file."),
    out: Path = typer.Option(..., help="Dataset directory to write (resumed if it exists)."),
    device: Optional[str] = _FILTER_OPTIONS["device"],
    window: Optional[tuple[float, float]] = _FILTER_OPTIONS["window"],
    workers: int = _FILTER_OPTIONS["workers"],
    compile_check: bool = _FILTER_OPTIONS["compile_check"],
    benchmark: Optional[Path] = _FILTER_OPTIONS["benchmark"],
    similarity: float = _FILTER_OPTIONS["similarity"],
    max_memory_mb: Optional[float] = _FILTER_OPTIONS["max_memory_mb"],
    restart_every: int = _FILTER_OPTIONS["restart_every"],
    time_limit: Optional[float] = _FILTER_OPTIONS["time_limit"],
    compose_workers: Optional[int] = _FILTER_OPTIONS["compose_workers"],
    devices: Optional[str] = _FILTER_OPTIONS["devices"],
    max_input_mb: Optional[float] = _FILTER_OPTIONS["max_input_mb"],
    max_op_sequence_share: Optional[float] = _FILTER_OPTIONS["max_op_sequence_share"],
    batch: int = _FILTER_OPTIONS["batch"],
) -> None:
    """Bound, de-duplicate, de-contaminate and execution-filter composed tasks into a dataset directory."""
    from cuda_agent.synth.dataset import DatasetError, read_dataset

    try:
        records = read_dataset(composed)
    except (DatasetError, OSError) as exc:
        fail_usage(str(exc))
    if not records:
        fail_usage(f"{composed}: no tasks")
    config = _run_config(len(records), 0, _filter_options(locals()))
    _run_pipeline(config, out, lambda index: records[index], None)


@synth_app.command("run")
def run_command(
    n: int = typer.Option(..., "--n", help="Composer seeds to try (the dataset keeps those that pass every stage)."),
    out: Path = typer.Option(..., help="Dataset directory to write (resumed if it exists)."),
    catalogue: Optional[Path] = typer.Option(None, help=f"Seed catalogue (default: mine one into OUT/{SEED_OPS})."),
    first_seed: int = typer.Option(0, help="First composer seed."),
    n_ops: Optional[int] = _COMPOSER_OPTIONS["n_ops"],
    llm: bool = _COMPOSER_OPTIONS["llm"],
    llm_base_url: Optional[str] = _COMPOSER_OPTIONS["llm_base_url"],
    llm_model: Optional[str] = _COMPOSER_OPTIONS["llm_model"],
    device: Optional[str] = _FILTER_OPTIONS["device"],
    window: Optional[tuple[float, float]] = _FILTER_OPTIONS["window"],
    workers: int = _FILTER_OPTIONS["workers"],
    compile_check: bool = _FILTER_OPTIONS["compile_check"],
    benchmark: Optional[Path] = _FILTER_OPTIONS["benchmark"],
    similarity: float = _FILTER_OPTIONS["similarity"],
    max_memory_mb: Optional[float] = _FILTER_OPTIONS["max_memory_mb"],
    restart_every: int = _FILTER_OPTIONS["restart_every"],
    time_limit: Optional[float] = _FILTER_OPTIONS["time_limit"],
    compose_workers: Optional[int] = _FILTER_OPTIONS["compose_workers"],
    devices: Optional[str] = _FILTER_OPTIONS["devices"],
    max_input_mb: Optional[float] = _FILTER_OPTIONS["max_input_mb"],
    max_op_sequence_share: Optional[float] = _FILTER_OPTIONS["max_op_sequence_share"],
    batch: int = _FILTER_OPTIONS["batch"],
) -> None:
    """All stages at once: mine (or load) seeds, compose, bound, de-duplicate, de-contaminate, filter on
    every GPU, write the dataset."""
    config = _run_config(n, first_seed, _filter_options(locals()))
    out.mkdir(parents=True, exist_ok=True)
    cat = _load_or_mine(catalogue, None if catalogue else out / SEED_OPS, True)
    composer = _composer(cat, config.filter.device, config.filter.window_ms, n_ops, llm, llm_base_url, llm_model,
                         config.max_input_mb)
    _run_pipeline(config, out, composer, _families(cat))


@synth_app.command("decontaminate")
def decontaminate_command(
    dataset: Path = typer.Argument(..., help="Dataset directory (from `synth run` or `synth filter`)."),
    benchmark: Path = typer.Option(..., help="Benchmark folder (e.g. a KernelBench checkout) to de-contaminate against."),
    similarity: float = _FILTER_OPTIONS["similarity"],
) -> None:
    """Withdraw a finished dataset's near-copies of a benchmark given after it was made; measures
    nothing, so it runs on any machine."""
    from cuda_agent.synth.dataset import DatasetError
    from cuda_agent.synth.pipeline import decontaminate_dataset

    if not 0 < similarity <= 1:
        fail_usage(f"--similarity must be in (0, 1], got {similarity}")
    try:
        numbers = decontaminate_dataset(dataset, benchmark, similarity)
    except (DatasetError, OSError, ValueError) as exc:
        fail_usage(str(exc))
    _print_stats(numbers, dataset)
    console.print(f"withdrawn now: {numbers['withdrawn']} near-copies of {benchmark}")


@synth_app.command("apply-checks")
def apply_checks_command(
    dataset: Path = typer.Argument(..., help="Dataset directory (from `synth run`, with its journal)."),
    checks: Path = typer.Option(..., help="The set's checks.parquet (bench/dataset_check.py merge), or one "
                                          "`cuda-agent tasks check --out` folder of this set."),
) -> None:
    """Take the set's self-check in: withdraw the tasks whose check did not come out `correct` (a
    worker or harness failure, or running out of a shared GPU's memory, is not held against a
    task), and give the `correct` ones the check's eager and compile times. Measures nothing;
    applying the same checks again changes nothing."""
    from cuda_agent.synth.dataset import DatasetError
    from cuda_agent.synth.pipeline import apply_checks

    try:
        numbers = apply_checks(dataset, checks)
    except (DatasetError, OSError, ValueError) as exc:
        fail_usage(str(exc))
    _print_stats(numbers, dataset)
    console.print(f"withdrawn now: {numbers['withdrawn']} tasks that did not come out correct; "
                  f"new times for {numbers['retimed']} tasks")


@synth_app.command("sample")
def sample_command(
    dataset: Path = typer.Argument(..., help="Dataset directory, or its tasks.parquet / tasks.jsonl."),
    n: int = typer.Option(200, "--n", help="Tasks in the sample."),
    out: Path = typer.Option(..., help="Directory to write the sample to (tasks.parquet, README.md)."),
) -> None:
    """Write a small sample of a dataset for tests and demos: equal shares per number of fused ops."""
    from cuda_agent.synth.dataset import DatasetError, write_sample

    try:
        numbers = write_sample(dataset, n, out)
    except (DatasetError, OSError) as exc:
        fail_usage(str(exc))
    except ImportError as exc:
        fail_usage(f"writing Parquet needs pyarrow ({exc}): pip install 'cuda-agent[parquet]'")
    _print_stats(numbers, out)


@synth_app.command("card")
def card_command(
    dataset: Path = typer.Argument(..., help="Dataset directory (from `synth run`, or a published copy)."),
    out: Optional[Path] = typer.Option(None, help="Where to write the card (default: DATASET/README.md); the "
                                                  "histogram PNGs go beside it."),
    benchmark: Optional[Path] = typer.Option(None, help="Benchmark folder for the decontamination report (e.g. "
                                                        "KernelBench/KernelBench: one row per level)."),
    checks: Optional[Path] = typer.Option(None, help="The set's checks.parquet, or one `cuda-agent tasks check --out` "
                                                     "folder of this set: its counts go into the card."),
    similarity: float = _FILTER_OPTIONS["similarity"],
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Write the histograms (needs matplotlib)."),
) -> None:
    """Write the full data card: how the set was made, rejections per rule, histograms, input sizes,
    diversity, op-family coverage, decontamination report, tasks-check counts, differences from Ops-6K."""
    from cuda_agent.synth.dataset import DatasetError
    from cuda_agent.synth.full_card import make_card

    if not 0 < similarity <= 1:
        fail_usage(f"--similarity must be in (0, 1], got {similarity}")
    try:
        numbers = make_card(dataset, out, benchmark, checks, similarity, plots)
    except (DatasetError, OSError, ValueError, ImportError) as exc:
        fail_usage(str(exc))
    written = out or dataset / "README.md"
    console.print(f"{written}: the card of {numbers['tasks']} tasks"
                  + (f", with {', '.join(numbers['plots'].values())}" if numbers.get("plots") else ""))


@synth_app.command("stats")
def stats_command(
    dataset: Path = typer.Argument(..., help="Dataset directory, or its tasks.parquet / tasks.jsonl."),
    json_out: bool = typer.Option(False, "--json", help="Print the numbers as one JSON object."),
) -> None:
    """Show a dataset's counts: tasks per number of fused ops and per family, the filter funnel, times."""
    from cuda_agent.synth.dataset import DatasetError, stats

    try:
        numbers = stats(dataset)
    except (DatasetError, OSError) as exc:
        fail_usage(str(exc))
    if json_out:
        print(json.dumps(numbers, default=str))
    else:
        _print_stats(numbers, dataset)


def _print_stats(numbers: dict, where: Path) -> None:
    from cuda_agent.synth.dataset import render_card

    console.print(render_card(numbers), markup=False)
    console.print(f"dataset: {where}")
