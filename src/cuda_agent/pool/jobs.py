"""What a pool evaluates and what it answers.

A job carries its task's source and its solution's files, not paths: it can cross a process
boundary, a Ray cluster or an HTTP request unchanged. Whoever runs it writes the files into a
content-addressed staging folder first (:meth:`SolutionFiles.stage`), under the names they had, so
the build cache key is the one an evaluation of the original files would use.
"""

from __future__ import annotations

import enum
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

from cuda_agent.environment import Task, Verdict, load_solution
from cuda_agent.unicode_text import encodable_text, is_unicode
from cuda_agent.environment.solution import KERNEL_SUFFIXES

SOURCE_SUFFIXES = (".py", *KERNEL_SUFFIXES)
"""Files of a solution folder that travel with a job; anything else (build outputs, caches) stays."""


class JobInputError(ValueError):
    """A job's task or solution is malformed; the message names the field and what was expected."""


def _check_relative_path(name: str) -> None:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or "\\" in name or any(part in ("", ".", "..") for part in name.split("/")):
        raise JobInputError(f"solution file name {name!r} must be a relative path like 'model_new.py' or "
                            "'kernels/relu.cu' (no '..', no leading '/')")


@dataclass(frozen=True)
class SolutionFiles:
    """A candidate's sources: ``(relative path, text)`` pairs, sorted by path.

    One top-level ``.py`` file is the single-file layout; anything else is a workdir
    (``model_new.py`` + ``kernels/``), exactly as on disk.
    """

    files: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        if not self.files:
            raise JobInputError("a solution needs at least one file (a .py defining ModelNew)")
        names = [name for name, _ in self.files]
        for name, text in self.files:
            _check_relative_path(name)
            if not isinstance(text, str):
                raise JobInputError(f"solution file {name!r} must be text, got {type(text).__name__}")
            if not is_unicode(name) or not is_unicode(text):
                raise JobInputError(f"solution file {encodable_text(name)!r} is not valid Unicode text "
                                    "(it holds a lone surrogate)")
        if len(set(names)) != len(names) or names != sorted(names):
            raise JobInputError("solution file names must be unique and sorted (use SolutionFiles.from_mapping)")

    @classmethod
    def from_mapping(cls, files: Mapping[str, str]) -> "SolutionFiles":
        return cls(tuple(sorted(files.items())))

    @classmethod
    def from_path(cls, path: str | Path) -> "SolutionFiles":
        """Read a solution from disk: a single ``.py`` file, or every source file of a workdir.

        Raises:
            SolutionError: the path holds no valid solution (see ``load_solution``).
            JobInputError: a source file is not UTF-8 text.
        """
        solution = load_solution(path)
        root = solution.root
        if root.is_file():
            return cls(((root.name, _read_text(root)),))
        files = {}
        for file in sorted(root.rglob("*")):
            relative = file.relative_to(root)
            if file.is_file() and file.suffix in SOURCE_SUFFIXES and not any(
                    part.startswith(".") or part == "__pycache__" for part in relative.parts):
                files[relative.as_posix()] = _read_text(file)
        return cls.from_mapping(files)

    @property
    def is_single_file(self) -> bool:
        return len(self.files) == 1 and "/" not in self.files[0][0] and self.files[0][0].endswith(".py")

    def content_hash(self) -> str:
        digest = hashlib.sha256()
        for name, text in self.files:
            digest.update(name.encode() + b"\0" + text.encode() + b"\0")
        return digest.hexdigest()

    def total_bytes(self) -> int:
        return sum(len(name.encode()) + len(text.encode()) for name, text in self.files)

    def stage(self, root: Path) -> Path:
        """Write the files under ``root/<content hash>/`` (once; concurrent callers are safe) and
        return the path to evaluate: the single file, or the workdir."""
        target = root / self.content_hash()
        if not target.is_dir():
            root.mkdir(parents=True, exist_ok=True)
            partial = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
            try:
                for name, text in self.files:
                    (partial / name).parent.mkdir(parents=True, exist_ok=True)
                    (partial / name).write_text(text)
            except BaseException:  # a full disk: leave no half-written folder behind
                shutil.rmtree(partial, ignore_errors=True)
                raise
            try:
                os.rename(partial, target)
            except OSError:  # another process staged the same content first
                shutil.rmtree(partial, ignore_errors=True)
        return target / self.files[0][0] if self.is_single_file else target

    def to_json_dict(self) -> dict[str, str]:
        return dict(self.files)


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise JobInputError(f"{path}: solution sources must be UTF-8 text") from None


@dataclass(frozen=True)
class EvalJob:
    """One (task, solution) evaluation. ``job_id`` is the caller's: unique among its jobs."""

    job_id: str
    task: Task
    solution: SolutionFiles

    def to_json_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "task": {"id": self.task.id, "code": self.task.code, "origin": self.task.origin},
                "solution": self.solution.to_json_dict()}

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> "EvalJob":
        task = data["task"]
        return cls(str(data["job_id"]), Task(id=task["id"], code=task["code"], origin=task["origin"]),
                   SolutionFiles.from_mapping(data["solution"]))


class JobStatus(str, enum.Enum):
    """``DONE``: the job has a verdict (pass or fail). ``FAILED``: the harness could not reach one
    (its worker died on every attempt, the pool closed first); ``error`` says why."""

    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class JobResult:
    """A pool's answer to one job: given exactly once per submitted job."""

    job_id: str
    status: JobStatus
    verdict: Verdict | None  # set iff status is DONE
    error: str | None  # set iff status is FAILED
    worker: str  # the lane that answered: "cuda:1", "cpu:0", "ray:3", ...
    attempts: int  # evaluation attempts made (a worker death costs one)
    queued_s: float  # from submission to the start of the answering attempt
    eval_s: float  # wall time of the answering attempt

    @property
    def ok(self) -> bool:
        return self.status is JobStatus.DONE

    def to_json_dict(self) -> dict[str, Any]:
        error = None if self.error is None else encodable_text(self.error)
        return {"job_id": self.job_id, "status": self.status.value, "error": error, "worker": self.worker,
                "attempts": self.attempts, "queued_s": self.queued_s, "eval_s": self.eval_s,
                "verdict": None if self.verdict is None else self.verdict.to_json_dict()}

    @classmethod
    def from_json_dict(cls, data: dict[str, Any], job_id: str | None = None) -> "JobResult":
        """The inverse of :meth:`to_json_dict`; ``job_id`` replaces the stored one (a remote id)."""
        verdict = None if data.get("verdict") is None else Verdict.from_json_dict(data["verdict"])
        return cls(job_id or data["job_id"], JobStatus(data["status"]), verdict, data.get("error"),
                   data.get("worker") or "", int(data.get("attempts") or 0), float(data.get("queued_s") or 0.0),
                   float(data.get("eval_s") or 0.0))
