"""Near-copy detection between tasks: against a benchmark (de-contamination) and within a dataset.

A task is reduced to a :class:`Fingerprint` of its normalised AST, which forgets what does not
change the computation:

- comments, docstrings, formatting, imports and type annotations;
- identifiers the author chose (variables, arguments, module constants, helper functions and
  classes, ``self.<attr>``), renamed ``n0, n1, ...`` / ``s0, s1, ...`` in order of first use;
- numeric literals, bucketed to ``int`` / ``float``: sizes and scalars are free parameters of a
  task, so a resized copy of a benchmark task is still that task. Strings, booleans and ``None``
  stay (``mode="bilinear"``, ``keepdim=True`` are substance);
- how an operator is spelled: ``torch.relu``, ``F.relu``, ``x.relu_()`` and ``nn.ReLU`` all become
  ``relu`` (last name, lower case, no underscores; ``x * y`` and ``torch.mul`` are both ``mul``).

The KernelBench names (``Model``, ``forward``, ``get_inputs``, ``get_init_inputs``) are the
format's fixed vocabulary, not the author's choice, and are kept. The input spec (module-level
size assignments, ``get_inputs``, ``get_init_inputs``) is the same template in every task with
free sizes, so it contributes only its string literals (a model or mode name selects the
computation; ``model_name = "gpt2"`` in KernelBench level 4).

A fingerprint has two token streams over the model's code: ``tokens``, the normalised tree in
pre-order, and ``ops``, the operators it applies in evaluation order (post-order, so
``relu(x + y)`` and ``t = x + y; relu(t)`` agree). The similarity of two tasks is the smaller of
the two streams' Ratcliff/Obershelp ratios (``difflib``, ``2 * matched / total``: order-aware,
exactly 1.0 for equal streams). Both must agree because each alone misleads: the template makes
the trees of two single-op tasks nearly equal (KernelBench ReLU vs Sigmoid: 0.96), and the same
operators can be composed into different programs. A task at or above the threshold (paper: 0.9)
is a copy.

Scale comes from an exact prefilter: ``ratio <= 2 * multiset overlap / total`` (difflib's own
``quick_ratio`` bound), and the overlap of the operator multisets of every pair is one matrix
product of (operator, occurrence) indicator vectors. Only pairs whose bounds reach the threshold
are compared exactly, and unlike MinHash/LSH no pair above the threshold can be missed.
"""

from __future__ import annotations

import ast
import difflib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cuda_agent.python_source import parse_source
from cuda_agent.synth.records import TaskRecord

logger = logging.getLogger(__name__)

_KEPT_NAMES = frozenset({"self", "Model", "ModelNew", "forward", "get_inputs", "get_init_inputs"})
_INPUT_FUNCTIONS = frozenset({"get_inputs", "get_init_inputs"})
_SKIPPED_FIELDS = frozenset({"ctx", "annotation", "returns", "type_comment"})
_OPERATOR_OPS = {
    ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.MatMult: "matmul", ast.Div: "div",
    ast.FloorDiv: "floordivide", ast.Mod: "remainder", ast.Pow: "pow", ast.BitAnd: "bitwiseand",
    ast.BitOr: "bitwiseor", ast.BitXor: "bitwisexor", ast.LShift: "bitwiseleftshift",
    ast.RShift: "bitwiserightshift", ast.USub: "neg", ast.Invert: "bitwisenot",
    ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne",
}
_OP_ALIASES = {"multiply": "mul", "subtract": "sub", "divide": "div", "truedivide": "div",
               "negative": "neg", "absolute": "abs", "clip": "clamp"}
_BLOCK_ROWS = 512


@dataclass(frozen=True)
class Fingerprint:
    """The normalised token streams of one task source (see the module docstring)."""

    tokens: tuple[str, ...]
    """The whole normalised tree, pre-order."""
    ops: tuple[str, ...]
    """Operators of the model in evaluation order."""


@dataclass(frozen=True)
class Drop:
    """Why a task was removed: the closest benchmark file or earlier task at or above threshold."""

    record: TaskRecord
    reason: str
    """``benchmark_match`` (de-contamination) or ``near_duplicate`` (de-duplication)."""
    matched: str
    """Benchmark file (path relative to the benchmark directory) or id of the earlier kept task."""
    score: float
    """Similarity to ``matched``, in [threshold, 1]."""


def _op_name(name: str) -> str:
    """``relu_``, ``ReLU``, ``torch.nn.functional.relu`` -> ``relu``: one name per operator."""
    canonical = name.rsplit(".", 1)[-1].lower().replace("_", "")
    return _OP_ALIASES.get(canonical, canonical)


class _Normaliser:
    """Walks one module once and produces its :class:`Fingerprint`."""

    def __init__(self, tree: ast.Module):
        self.imports = _imported_names(tree)
        self.bound = _bound_names(tree)
        self.names: dict[str, str] = {}
        self.attrs: dict[str, str] = {}
        self.tokens: list[str] = []
        self.ops: list[str] = []

    def api(self, node: ast.expr) -> str | None:
        """Dotted path of an imported name or an attribute chain on one, else None."""
        if isinstance(node, ast.Name):
            return self.imports.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.api(node.value)
            return f"{base}.{node.attr}" if base is not None else None
        return None

    def name(self, identifier: str) -> str:
        """Placeholder for a name the file binds; builtins and the format's names stay."""
        if identifier in _KEPT_NAMES or identifier.startswith("__") or identifier not in self.bound:
            return identifier
        return self.names.setdefault(identifier, f"n{len(self.names)}")

    def walk(self, node: ast.AST) -> None:
        """Append ``node``'s tokens (pre-order) and operators (post-order) to the streams."""
        emit = self.tokens.append
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_string_statement(node):
            return
        if isinstance(node, ast.Constant) or _is_signed_number(node):
            emit(_constant_token(node))
            return
        path = self.api(node) if isinstance(node, ast.expr) else None
        if path is not None:
            emit("api:" + _op_name(path))
            return
        if isinstance(node, ast.Name):
            emit(self.name(node.id))
            return
        if isinstance(node, ast.Attribute) and _is_self(node.value):
            emit("self." + self.attrs.setdefault(node.attr, f"s{len(self.attrs)}"))
            return
        if isinstance(node, ast.AnnAssign) and node.value is None:
            return
        emit("Assign" if isinstance(node, ast.AnnAssign) else type(node).__name__)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
            emit("super")  # super(Model, self) is the Python 2 spelling of super()
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            emit(self.name(node.name))
        elif isinstance(node, ast.arg):
            emit(self.name(node.arg))
        elif isinstance(node, ast.keyword):
            emit(f"kw:{node.arg or '**'}")
        elif isinstance(node, ast.Attribute):
            emit("." + node.attr)
        for field, value in ast.iter_fields(node):
            if field in _SKIPPED_FIELDS:
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    self.walk(child)
        self.record_op(node)

    def record_op(self, node: ast.AST) -> None:
        """The operator ``node`` applies, once its operands are recorded (evaluation order)."""
        if isinstance(node, ast.Call):
            path = self.api(node.func)
            if path is not None:
                self.ops.append(_op_name(path))
            elif (isinstance(node.func, ast.Attribute) and not _is_self(node.func.value)
                  and not node.func.attr.startswith("__")):
                self.ops.append(_op_name(node.func.attr))
        elif isinstance(node, (ast.BinOp, ast.UnaryOp, ast.AugAssign)):
            if type(node.op) in _OPERATOR_OPS:
                self.ops.append(_OPERATOR_OPS[type(node.op)])
        elif isinstance(node, ast.Compare):
            self.ops.extend(_OPERATOR_OPS[type(op)] for op in node.ops if type(op) in _OPERATOR_OPS)


def _imported_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted module path for every import in the file (``F`` -> ``torch.nn.functional``)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    head = alias.name.split(".", 1)[0]
                    names[head] = head
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}".lstrip(".")
    return names


def _bound_names(tree: ast.Module) -> frozenset[str]:
    """Names the file itself binds (assigned, defined, arguments): the author's choices."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return frozenset(bound)


def _is_input_spec(statement: ast.stmt) -> bool:
    """Module-level sizes and ``get_inputs`` / ``get_init_inputs``: the same template in every
    task, with sizes that are free parameters; the model's code is what tells tasks apart."""
    return (isinstance(statement, (ast.Assign, ast.AnnAssign))
            or isinstance(statement, ast.FunctionDef) and statement.name in _INPUT_FUNCTIONS)


def _string_tokens(statement: ast.stmt) -> Iterator[str]:
    """String literals of the input spec: names such as ``model_name = "gpt2"`` or an activation
    passed through ``get_init_inputs`` select the computation, unlike sizes."""
    nodes = list(ast.walk(statement))
    docstrings = {id(node.value) for node in nodes if _is_string_statement(node)}
    for node in nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield "str:" + node.value


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _is_string_statement(node: ast.AST) -> bool:
    """Docstrings and other bare string statements: text, not computation."""
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def _is_signed_number(node: ast.AST) -> bool:
    """``-1`` parses as negation of ``1``; it is one literal, not an operator."""
    return (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, (int, float, complex))
            and not isinstance(node.operand.value, bool))


def _constant_token(node: ast.AST) -> str:
    value = node.operand.value if isinstance(node, ast.UnaryOp) else node.value
    if isinstance(value, (bool, type(None), type(...))):
        return repr(value)
    if isinstance(value, (int, float, complex)):
        return type(value).__name__
    if isinstance(value, bytes):
        return "bytes"
    return "str:" + value


def fingerprint(source: str, name: str = "<task>") -> Fingerprint:
    """Normalise one task source.

    Args:
        source: Python source of a KernelBench-format task.
        name: What to call the source in errors (a file path or task id).

    Raises:
        ValueError: ``source`` is not valid Python.
    """
    try:
        tree = parse_source(source)
    except SyntaxError as exc:
        raise ValueError(f"{name}: not valid Python ({exc.msg}, line {exc.lineno}); "
                         "tasks must parse to be compared") from exc
    walker = _Normaliser(tree)
    for statement in tree.body:
        if _is_input_spec(statement):
            walker.tokens.extend(_string_tokens(statement))
        else:
            walker.walk(statement)
    return Fingerprint(tokens=tuple(walker.tokens), ops=tuple(walker.ops))


def _ratio(a: Sequence[str], b: Sequence[str]) -> float:
    """difflib ratio, made symmetric by a fixed argument order (its greedy matching is not)."""
    if a > b:
        a, b = b, a
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def similarity(a: Fingerprint, b: Fingerprint) -> float:
    """Similarity of two tasks in [0, 1]: the smaller of the operator and tree stream ratios."""
    return min(_ratio(a.ops, b.ops), _ratio(a.tokens, b.tokens))


def _score_at_least(a: Fingerprint, b: Fingerprint, threshold: float) -> float:
    """``similarity(a, b)`` when it reaches ``threshold``, else some value below it (cheaper)."""
    ops = _ratio(a.ops, b.ops)
    if ops < threshold:
        return ops
    if a.tokens > b.tokens:
        a, b = b, a
    matcher = difflib.SequenceMatcher(None, a.tokens, b.tokens, autojunk=False)
    if matcher.quick_ratio() < threshold:
        return 0.0
    return min(ops, matcher.ratio())


class _OpIndicators:
    """Fingerprints as rows of 0/1 over (operator, occurrence) features, added batch by batch: the
    dot product of two rows is the overlap of their operator multisets. Storage doubles as it
    fills, so adding a batch costs its own rows, not the whole matrix again."""

    def __init__(self) -> None:
        self._features: dict[tuple[str, int], int] = {}
        self._matrix = np.zeros((64, 64), dtype=np.float32)
        self._ops: list[int] = []
        self._tokens: list[int] = []

    @property
    def rows(self) -> int:
        return len(self._ops)

    def add(self, fingerprints: Sequence[Fingerprint]) -> range:
        """Append one row per fingerprint; returns their row indices."""
        first = self.rows
        for fp in fingerprints:
            seen: dict[str, int] = {}
            columns = []
            for op in fp.ops:
                seen[op] = seen.get(op, 0) + 1
                columns.append(self._features.setdefault((op, seen[op]), len(self._features)))
            height, width = self._matrix.shape
            if self.rows == height or len(self._features) > width:
                grown = np.zeros((2 * height if self.rows == height else height, max(2 * width, len(self._features))),
                                 dtype=np.float32)
                grown[:height, :width] = self._matrix
                self._matrix = grown
            self._matrix[self.rows, columns] = 1.0
            self._ops.append(len(fp.ops))
            self._tokens.append(len(fp.tokens))
        return range(first, self.rows)

    def candidates(self, queries: range, refs: range, threshold: float) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(query row, ref rows)`` whose similarity upper bounds reach ``threshold``.

        Bounds: difflib's multiset bound on the operator streams (a matrix product) and the length
        bound ``2 * min(len) / (len + len)`` on the tree streams.
        """
        width = len(self._features) or 1
        ops, tokens = np.array(self._ops, dtype=np.float64), np.array(self._tokens, dtype=np.float64)
        ref_matrix = self._matrix[refs.start:refs.stop, :width]
        ref_ops, ref_tokens = ops[refs.start:refs.stop], tokens[refs.start:refs.stop]
        slack = threshold - 1e-9  # float rounding must never drop a pair whose bound equals it
        for start in range(queries.start, queries.stop, _BLOCK_ROWS):
            stop = min(start + _BLOCK_ROWS, queries.stop)
            overlap = (self._matrix[start:stop, :width] @ ref_matrix.T).astype(np.float64)
            total = ops[start:stop, None] + ref_ops[None, :]
            op_bound = np.where(total > 0, 2 * overlap / np.maximum(total, 1), 1.0)
            lengths = tokens[start:stop, None], ref_tokens[None, :]
            length_bound = 2 * np.minimum(*lengths) / np.maximum(lengths[0] + lengths[1], 1)
            hits = (op_bound >= slack) & (length_bound >= slack)
            for offset in np.flatnonzero(hits.any(axis=1)):
                yield start + int(offset), refs.start + np.flatnonzero(hits[offset])


def _check_threshold(threshold: float) -> None:
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"similarity threshold must be in (0, 1], got {threshold!r} "
                         "(the paper uses 0.9)")


def load_benchmark(path: str | Path) -> dict[str, str]:
    """Read every task file (defines ``Model`` and ``get_inputs``) under a benchmark directory.

    Other ``*.py`` files (a checkout's scripts and library code) are skipped, so both a
    KernelBench checkout and its ``KernelBench/`` folder work.

    Args:
        path: Directory searched recursively, e.g. a KernelBench checkout with ``level1..3``.

    Returns:
        ``{path relative to the directory (POSIX): source}``, sorted by path.

    Raises:
        FileNotFoundError: ``path`` does not exist or is not a directory.
        ValueError: A ``*.py`` file does not parse, or no task file was found.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"benchmark directory {str(root)!r} does not exist or is not a "
                                "directory; pass e.g. a KernelBench checkout")
    sources = {}
    for file in sorted(root.rglob("*.py")):
        relative = file.relative_to(root)
        if any(part.startswith(".") for part in relative.parts):
            continue
        source = file.read_text(encoding="utf-8")
        try:
            tree = parse_source(source)
        except SyntaxError as exc:
            raise ValueError(f"benchmark file {str(file)!r} is not valid Python ({exc.msg}, "
                             f"line {exc.lineno}); fix it or pass the task folder only") from exc
        defined = {node.name for node in tree.body
                   if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
        if {"Model", "get_inputs"} <= defined:
            sources[relative.as_posix()] = source
    if not sources:
        raise ValueError(f"no task files under {str(root)!r}: expected *.py files that define "
                         "class Model and get_inputs() (KernelBench format)")
    logger.info("loaded %d benchmark tasks from %s", len(sources), root)
    return sources


@dataclass(frozen=True)
class BenchmarkIndex:
    """A benchmark's task files with their fingerprints, computed once for many batches of tasks."""

    names: tuple[str, ...]
    fingerprints: tuple[Fingerprint, ...]

    @classmethod
    def of(cls, sources: Mapping[str, str]) -> BenchmarkIndex:
        """Raises:
            ValueError: a source does not parse.
        """
        names = tuple(sources)
        return cls(names, tuple(fingerprint(sources[name], name) for name in names))


def decontaminate(records: Sequence[TaskRecord], benchmark: Mapping[str, str] | BenchmarkIndex,
                  threshold: float = 0.9) -> tuple[list[TaskRecord], list[Drop]]:
    """Drop every task whose similarity to some benchmark task is at least ``threshold``.

    Args:
        records: Tasks to check, in any order (each is judged alone).
        benchmark: ``{name: source}``, e.g. from :func:`load_benchmark`, or its index.
        threshold: Similarity at or above which a task counts as a benchmark copy.

    Returns:
        ``(kept, dropped)``: kept records in input order; one :class:`Drop` per removed record,
        naming the most similar benchmark file.

    Raises:
        ValueError: ``threshold`` is outside (0, 1], or a source does not parse.
    """
    _check_threshold(threshold)
    index = benchmark if isinstance(benchmark, BenchmarkIndex) else BenchmarkIndex.of(benchmark)
    queries = [fingerprint(record.code, f"task {record.id}") for record in records]
    indicators = _OpIndicators()
    query_rows, ref_rows = indicators.add(queries), indicators.add(index.fingerprints)
    best: dict[int, tuple[float, str]] = {}
    for i, rows in indicators.candidates(query_rows, ref_rows, threshold):
        for j in rows - ref_rows.start:
            score = _score_at_least(queries[i], index.fingerprints[j], threshold)
            if score >= threshold and score > best.get(i, (-1.0, ""))[0]:
                best[i] = (score, index.names[j])
    kept = [record for i, record in enumerate(records) if i not in best]
    dropped = [Drop(records[i], "benchmark_match", name, score)
               for i, (score, name) in sorted(best.items())]
    logger.info("de-contamination: %d of %d tasks match a benchmark task at >= %s",
                len(dropped), len(records), threshold)
    return kept, dropped


class NearDuplicates:
    """De-duplication batch by batch: the tasks kept so far, against which :meth:`screen` judges
    each new task in order. Screening tasks in batches gives the same result as screening them all
    at once, so the pipeline can pass tasks on as they are composed."""

    def __init__(self, threshold: float = 0.9) -> None:
        """Raises:
            ValueError: ``threshold`` is outside (0, 1].
        """
        _check_threshold(threshold)
        self.threshold = threshold
        self.kept: list[TaskRecord] = []
        self._indicators = _OpIndicators()
        self._screened: list[tuple[TaskRecord, Fingerprint]] = []
        """Every task screened, by indicator row."""
        self._kept_rows: set[int] = set()

    def screen(self, records: Sequence[TaskRecord]) -> tuple[list[TaskRecord], list[Drop]]:
        """Keep each of ``records`` (in order) unless it is at least ``threshold`` similar to a
        task kept before it, here or in an earlier batch.

        Returns:
            ``(kept, dropped)`` as for :func:`decontaminate`; ``Drop.matched`` is the id of the kept
            task the dropped one is most similar to (the earliest on a tie).

        Raises:
            ValueError: a task's code does not parse.
        """
        fps = [fingerprint(record.code, f"task {record.id}") for record in records]
        rows = self._indicators.add(fps)
        self._screened += zip(records, fps)
        candidates = dict(self._indicators.candidates(rows, range(rows.stop), self.threshold))
        kept, dropped = [], []
        for row in rows:
            record, fp = self._screened[row]
            scored = [(_score_at_least(fp, self._screened[j][1], self.threshold), j)
                      for j in candidates.get(row, ()) if j in self._kept_rows]
            score, j = max(scored, key=lambda pair: (pair[0], -pair[1]), default=(0.0, -1))
            if score >= self.threshold:
                dropped.append(Drop(record, "near_duplicate", self._screened[j][0].id, score))
            else:
                self._kept_rows.add(row)
                kept.append(record)
        self.kept += kept
        return kept, dropped


def deduplicate(records: Sequence[TaskRecord],
                threshold: float = 0.9) -> tuple[list[TaskRecord], list[Drop]]:
    """Keep the first of every group of near-copies: a task is dropped when it is at least
    ``threshold`` similar to an earlier *kept* task.

    Args:
        records: Tasks in priority order (earlier ones win).
        threshold: Similarity at or above which two tasks count as copies.

    Returns:
        ``(kept, dropped)`` as for :func:`decontaminate`; ``Drop.matched`` is the id of the kept
        task the dropped one is most similar to.

    Raises:
        ValueError: ``threshold`` is outside (0, 1], or a task's code does not parse.
    """
    kept, dropped = NearDuplicates(threshold).screen(records)
    logger.info("de-duplication: %d of %d tasks are near-copies of earlier ones",
                len(dropped), len(records))
    return kept, dropped
