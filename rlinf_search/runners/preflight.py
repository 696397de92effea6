"""The checks a training run makes before any worker starts, each failing in one line that names the key and what
to do: the output folder can be written, the model folder holds a config and readable weights, the tokenizer has
the chat template the protocol needs, ``runner.resume_dir`` is a checkpoint of this model, and every service the
run calls (each retrieval server or replica, the distillation teacher) answers.

Without them a dead retrieval server trained the model not to search (every search an error observation, every
answer 0), and a bad path ended in a traceback after the cluster had started.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import httpx

from rlinf_search.checkpoint import HF_SUBDIR, is_usable_checkpoint, latest_checkpoint
from rlinf_search.config import RunConfig

# Long enough for a loaded server to answer a health probe, short enough that a typo is reported at once.
_PROBE_TIMEOUT_S = 5.0
# The fields that make two checkpoints of one model interchangeable: a resume from another model fails in the load.
_SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


class PreflightFailed(RuntimeError):
    """The run cannot start as configured; the message is one line naming the key and what to do."""


def check_before_start(config: RunConfig) -> None:
    """Every check, local ones first; raises ``PreflightFailed`` on the first that fails."""
    check_files(config)
    check_services(config)


def check_files(config: RunConfig) -> None:
    """What is on this machine: the output folder, the model, its template, the checkpoint to resume from."""
    check_writable(config.runner.output_dir, key="runner.output_dir")
    model_path = config.rollout.model_path
    check_model_dir(model_path, key="rollout.model.model_path")
    check_chat_template(model_path, config)
    check_resume_dir(config)


def check_services(config: RunConfig) -> None:
    """What the run calls over the network: every retrieval server or replica, and the teacher."""
    if config.search.backend == "local":
        for addr in config.search.server_addrs:
            check_answers(f"http://{addr}/health", key="tools.search.server_addr",
                          what=f"the retrieval server at {addr}",
                          fix="start it (examples/searchr1/launch_local_server.sh) or correct the address")
    if config.distill is not None:
        teacher = config.distill.teacher
        check_answers(f"{teacher.base_url.rstrip('/')}/models", key="algorithm.distill.teacher.base_url",
                      what=f"the teacher at {teacher.base_url}", proxy=teacher.proxy,
                      fix="start it (examples/searchr1/start_teacher_server.sh) or correct the URL")


def check_writable(folder: str, *, key: str) -> None:
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise PreflightFailed(f"{key}: cannot write to {folder} ({exc.strerror or type(exc).__name__}); choose a "
                              "folder this user can write") from None


def _looks_like_hub_id(path: str) -> bool:
    """``Qwen/Qwen2.5-3B-Instruct``: a name the loader fetches, not a folder that must exist here."""
    return not os.path.isabs(path) and not path.startswith(".") and path.count("/") == 1 and "\\" not in path


def check_model_dir(path: str, *, key: str) -> None:
    """A folder with ``config.json`` and weights whose headers read (a truncated safetensors file fails here)."""
    folder = Path(path)
    if not folder.exists():
        if _looks_like_hub_id(path):
            return
        raise PreflightFailed(f"{key}: no model folder at {path}; give a Hugging Face model folder "
                              "(toolkits/make_tiny_model.py makes one)")
    if not folder.is_dir():
        raise PreflightFailed(f"{key}: {path} is a file; give the model's folder (the one holding config.json)")
    if not (folder / "config.json").is_file():
        raise PreflightFailed(f"{key}: {path} has no config.json; give a Hugging Face model folder")
    safetensors = sorted(folder.glob("*.safetensors"))
    others = sorted(folder.glob("*.bin")) + sorted(folder.glob("*.pt"))
    if not safetensors and not others:
        raise PreflightFailed(f"{key}: {path} holds no weights (*.safetensors or *.bin)")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError) as exc:
            raise PreflightFailed(f"{key}: {index} is not a readable shard index ({type(exc).__name__})") from None
        missing = sorted(s for s in shards if not (folder / s).is_file())
        if missing:
            raise PreflightFailed(f"{key}: {path} lacks the weight shards {missing[:3]} its index names; copy the "
                                  "whole model folder")
    from safetensors import safe_open

    for file in safetensors:
        try:
            with safe_open(str(file), framework="pt") as handle:
                handle.keys()
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for every damage
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise PreflightFailed(f"{key}: cannot read {file} ({reason}); the file is damaged or truncated, copy it "
                                  "again") from None
    for file in others:
        if file.stat().st_size == 0:
            raise PreflightFailed(f"{key}: {file} is empty; copy the weights again")


def _chat_prompts(paths: tuple[str, ...]) -> bool:
    """Whether the first prompt of any training file is chat messages (they need the tokenizer's template)."""
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                first = handle.readline()
            if isinstance(json.loads(first).get("prompt"), list):
                return True
        except (OSError, ValueError, AttributeError):
            continue  # the prompt reader reports an unreadable file with its own message
    return False


def check_chat_template(model_path: str, config: RunConfig) -> None:
    """The tokenizer loads, and has a chat template where the prompts or the protocol need one."""
    from transformers import AutoTokenizer

    key = "rollout.model.model_path"
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a folder it cannot read
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PreflightFailed(f"{key}: cannot load a tokenizer from {model_path} ({reason[:200]})") from None
    has_template = bool(getattr(tokenizer, "chat_template", None))
    toolcall = config.agent_loop.protocol == "toolcall"
    if toolcall and not has_template:
        raise PreflightFailed(f"{key}: the tokenizer at {model_path} has no chat template, and agent.protocol toolcall "
                              "renders the tools through it; use a model whose template supports function calling")
    if (config.agent_loop.apply_chat_template and not has_template
            and _chat_prompts(config.train_data_paths + config.val_data_paths)):
        raise PreflightFailed(f"{key}: the tokenizer at {model_path} has no chat template, and the prompts are chat "
                              "messages; use a model with one, or set data.apply_chat_template: false to train on "
                              "the messages' text as it is")


def _model_shape(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: config.get(k) for k in _SHAPE_KEYS}


def check_resume_dir(config: RunConfig) -> None:
    """``runner.resume_dir``: a complete checkpoint (``auto``: none yet is fine) of the model this run trains."""
    resume = config.runner.resume_dir
    if not resume:
        return
    key = "runner.resume_dir"
    if resume == "auto":
        folder = latest_checkpoint(Path(config.runner.output_dir) / "checkpoints")
        if folder is None:
            return
    else:
        folder = Path(resume)
        if not folder.is_dir():
            raise PreflightFailed(f"{key}: no checkpoint folder at {resume}; give a global_step_N folder under "
                                  "<output_dir>/checkpoints, or auto")
        if not is_usable_checkpoint(folder):
            raise PreflightFailed(f"{key}: {resume} is not a complete checkpoint (its COMPLETE mark, runner state, "
                                  "training state or weights are missing or damaged); give a global_step_N folder, "
                                  "or auto for the newest usable one")
    saved, wanted = _model_shape(folder / HF_SUBDIR), _model_shape(Path(config.rollout.model_path))
    if saved and wanted and saved != wanted:
        differ = ", ".join(f"{k} {saved[k]} vs {wanted[k]}" for k in _SHAPE_KEYS if saved[k] != wanted[k])
        raise PreflightFailed(f"{key}: {folder} holds another model than rollout.model.model_path ({differ}); resume "
                              "with the model the checkpoint was trained from")


def check_answers(url: str, *, key: str, what: str, fix: str, proxy: str | None = None) -> None:
    """``GET url`` gets any HTTP answer below 500 (a server without the route says 404, and is up)."""
    try:
        response = httpx.get(url, timeout=_PROBE_TIMEOUT_S, trust_env=False, proxy=proxy)
    except httpx.HTTPError as exc:
        raise PreflightFailed(f"{key}: {what} does not answer (GET {url}: {type(exc).__name__}); {fix}") from None
    if response.status_code >= 500:
        raise PreflightFailed(f"{key}: {what} is failing (GET {url}: HTTP {response.status_code}); {fix}")
