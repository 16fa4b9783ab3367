"""Near-copy detection: normalisation, the similarity's separation, and the prefilter's exactness."""

from __future__ import annotations

import ast
import itertools
import shutil
from pathlib import Path

import pytest

from cuda_agent.synth.decontaminate import (decontaminate, deduplicate, fingerprint, load_benchmark,
                                            similarity)
from cuda_agent.synth.records import TaskRecord

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"
SOURCES = {path.name: path.read_text() for path in sorted(EXAMPLE_TASKS.glob("*.py"))}

# rmsnorm.py by another hand: new names everywhere, Python 2 super(), a comment instead of
# docstrings, other sizes written as one tuple assignment, other formatting.
RMSNORM_REWRITTEN = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, hidden_size, epsilon):
        super(Model, self).__init__()
        self.epsilon = epsilon
        self.gain = nn.Parameter(torch.ones(hidden_size) + 0.5 * torch.randn(hidden_size))

    def forward(self, inp):  # root-mean-square normalisation
        inv = torch.rsqrt(inp.pow(2).mean(dim=-1,
                                          keepdim=True) + self.epsilon)
        return inp * inv * self.gain


B, S, H = 4, 128, 256


def get_inputs():
    return [torch.randn(B, S, H)]


def get_init_inputs():
    return [H, 1e-5]
'''


class _Renamer(ast.NodeTransformer):
    """Renames every name the file binds and every ``self`` attribute (a mechanical copy)."""

    def __init__(self, bound: set[str]):
        self.bound = bound

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id in self.bound:
            node.id += "_renamed"
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        if node.arg in self.bound:
            node.arg += "_renamed"
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.Attribute:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            node.attr = "my_" + node.attr
        return node


def renamed_copy(source: str) -> str:
    """The source with all chosen names changed, docstrings and comments dropped, reformatted."""
    tree = ast.parse(source)
    keep = {"self", "Model", "forward", "get_inputs", "get_init_inputs", "__init__"}
    bound = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    bound |= {node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)}
    tree = _Renamer(bound - keep).visit(tree)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def record(code: str, seed: int = 0) -> TaskRecord:
    return TaskRecord(code=code, ops=[], composer="deterministic", seed=seed)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_renamed_reformatted_copy_scores_one(name: str) -> None:
    copy = renamed_copy(SOURCES[name])
    assert copy != SOURCES[name]
    assert similarity(fingerprint(SOURCES[name]), fingerprint(copy)) == 1.0


def test_rewritten_rmsnorm_is_a_copy() -> None:
    assert similarity(fingerprint(SOURCES["rmsnorm.py"]), fingerprint(RMSNORM_REWRITTEN)) >= 0.9


def test_tasks_sharing_the_template_score_low() -> None:
    fingerprints = {name: fingerprint(source) for name, source in SOURCES.items()}
    for a, b in itertools.combinations(fingerprints, 2):
        assert similarity(fingerprints[a], fingerprints[b]) <= 0.5, (a, b)


def test_operator_spellings_normalise_to_one_operator() -> None:
    spellings = ["torch.relu(x)", "F.relu(x)", "x.relu_()", "torch.nn.functional.relu(x)"]
    prefix = "import torch\nimport torch.nn.functional as F\n"
    ops = {fingerprint(f"{prefix}def f(x):\n    return {call}\n").ops for call in spellings}
    assert ops == {("relu",)}
    module = fingerprint("import torch.nn as nn\nclass Model(nn.Module):\n"
                         "    def __init__(self):\n        super().__init__()\n        self.a = nn.ReLU()\n")
    assert module.ops == ("relu",)


def test_operators_are_recorded_in_evaluation_order() -> None:
    nested = fingerprint("import torch\ndef f(x, y, z):\n    return torch.relu(x + y) * z\n")
    split = fingerprint("import torch\ndef f(x, y, z):\n    t = x + y\n    t = torch.relu(t)\n"
                        "    return t * z\n")
    assert nested.ops == split.ops == ("add", "relu", "mul")


def test_similarity_is_symmetric() -> None:
    a, b = fingerprint(SOURCES["add_relu_mul.py"]), fingerprint(SOURCES["relu.py"])
    assert similarity(a, b) == similarity(b, a)


def test_deduplicate_keeps_first_and_names_the_match() -> None:
    originals = [record(SOURCES[name], seed) for seed, name in enumerate(sorted(SOURCES))]
    relu, rmsnorm = (next(r for r in originals if r.code == SOURCES[n]) for n in ("relu.py", "rmsnorm.py"))
    copies = [record(renamed_copy(SOURCES["relu.py"]), 10), record(RMSNORM_REWRITTEN, 11)]
    kept, dropped = deduplicate(originals + copies)
    assert kept == originals
    assert [(d.record, d.reason, d.matched) for d in dropped] == [
        (copies[0], "near_duplicate", relu.id), (copies[1], "near_duplicate", rmsnorm.id)]
    assert all(0.9 <= d.score <= 1.0 for d in dropped)


def test_deduplicate_compares_only_with_kept_tasks() -> None:
    a = "import torch\ndef f(x):\n    return torch.relu(torch.exp(torch.tanh(x)))\n"
    b = "import torch\ndef f(x):\n    return torch.relu(torch.exp(torch.sin(x)))\n"
    c = "import torch\ndef f(x):\n    return torch.relu(torch.cos(torch.sin(x)))\n"
    # b is close to a (dropped at 0.6); c is close to b only, so with b gone c stays.
    kept, dropped = deduplicate([record(a), record(b), record(c)], threshold=0.6)
    assert [r.code for r in kept] == [a, c]
    assert [d.record.code for d in dropped] == [b]


@pytest.fixture()
def benchmark_dir(tmp_path: Path) -> Path:
    """A small KernelBench-like checkout: task folders plus a script that is not a task."""
    root = tmp_path / "KernelBench"
    for level, names in {"level1": ["relu.py", "softmax.py", "matmul.py"], "level2": ["row_sum.py"]}.items():
        (root / level).mkdir(parents=True)
        for name in names:
            shutil.copy(EXAMPLE_TASKS / name, root / level / name)
    (root / "scripts").mkdir()
    (root / "scripts" / "run_eval.py").write_text("import sys\nprint(sys.argv)\n")
    return root


def test_load_benchmark_reads_task_files_only(benchmark_dir: Path) -> None:
    sources = load_benchmark(benchmark_dir)
    assert list(sources) == ["level1/matmul.py", "level1/relu.py", "level1/softmax.py", "level2/row_sum.py"]
    assert sources["level1/relu.py"] == SOURCES["relu.py"]


def test_decontaminate_drops_benchmark_copies(benchmark_dir: Path) -> None:
    copy = record(renamed_copy(SOURCES["softmax.py"]), 1)
    resized = record(SOURCES["matmul.py"].replace("N = 512", "N = 4096"), 2)
    new = [record(SOURCES[name], seed) for seed, name in enumerate(["add_relu_mul.py", "rmsnorm.py"], 3)]
    kept, dropped = decontaminate([copy, new[0], resized, new[1]], load_benchmark(benchmark_dir))
    assert kept == new
    assert [(d.record, d.reason, d.matched, d.score) for d in dropped] == [
        (copy, "benchmark_match", "level1/softmax.py", 1.0),
        (resized, "benchmark_match", "level1/matmul.py", 1.0)]


# Edits of the example tasks whose similarities to them spread over (0, 1].
EDITED = {
    "relu_sigmoid.py": SOURCES["relu.py"].replace("torch.relu(x)", "torch.sigmoid(torch.relu(x))"),
    "add_relu_mul_add.py": SOURCES["add_relu_mul.py"].replace("* z", "* z + x"),
    "log_softmax.py": SOURCES["softmax.py"].replace("torch.softmax", "torch.log_softmax"),
    "square_sum.py": SOURCES["row_sum.py"].replace("torch.sum(x,", "torch.sum(x * x,"),
    "matmul_add.py": SOURCES["matmul.py"].replace("torch.matmul(A, B)", "torch.matmul(A, B) + A"),
    "rmsnorm_rewritten.py": RMSNORM_REWRITTEN,
}


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7, 0.9, 1.0])
def test_decontaminate_matches_all_pairs_reference(threshold: float) -> None:
    """The fast path (bounds, then exact scores) misses no pair that brute force finds."""
    records = [record(code, seed) for seed, code in enumerate(SOURCES.values())]
    benchmark = {name: fingerprint(code) for name, code in EDITED.items()}
    expected = []
    for task in records:
        score, name = max((similarity(fingerprint(task.code), fp), name) for name, fp in benchmark.items())
        if score >= threshold:
            expected.append((task, name, score))
    _, dropped = decontaminate(records, EDITED, threshold)
    assert [(d.record, d.matched, d.score) for d in dropped] == expected
    assert 0 < len(expected) < len(records) or threshold == 1.0


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7, 0.9])
def test_deduplicate_matches_greedy_reference(threshold: float) -> None:
    records = [record(code, seed) for seed, code in enumerate([*SOURCES.values(), *EDITED.values()])]
    kept_reference = []
    for task in records:
        if all(similarity(fingerprint(task.code), fingerprint(k.code)) < threshold for k in kept_reference):
            kept_reference.append(task)
    kept, dropped = deduplicate(records, threshold)
    assert kept == kept_reference
    assert len(dropped) == len(records) - len(kept)


def test_errors_name_the_path_or_task(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_benchmark(tmp_path / "nowhere")
    (tmp_path / "notes.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="no task files"):
        load_benchmark(tmp_path)
    (tmp_path / "broken.py").write_text("def (:\n")
    with pytest.raises(ValueError, match="broken.py"):
        load_benchmark(tmp_path)
    bad = record("class Model(:\n")
    with pytest.raises(ValueError, match=bad.id):
        deduplicate([bad])
    with pytest.raises(ValueError, match="threshold"):
        deduplicate([], threshold=1.5)
