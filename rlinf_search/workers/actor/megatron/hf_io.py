"""Read and write a HF model directory's weights as a plain state dict (no model instantiated).

Shared by the Megatron actor (load at start, save at checkpoints) and the checkpoint converter.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from rlinf_search.workers.actor.megatron.weights import StateDict

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
# Everything a HF tokenizer directory may hold; copied next to converted weights so the result loads
# with AutoTokenizer as well as AutoModelForCausalLM.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "added_tokens.json", "chat_template.jinja", "tokenizer.model")


def read_hf_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {model_dir}: give the HF model directory the checkpoint came from")
    return json.loads(path.read_text())


def read_hf_state(model_dir: str | Path) -> StateDict:
    """The weights of a HF model directory: one safetensors file, a sharded set, or pytorch_model.bin."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    if (model_dir / SAFETENSORS).is_file():
        return load_file(str(model_dir / SAFETENSORS))
    if (model_dir / SAFETENSORS_INDEX).is_file():
        index = json.loads((model_dir / SAFETENSORS_INDEX).read_text())
        state: StateDict = {}
        for shard in sorted(set(index["weight_map"].values())):
            state.update(load_file(str(model_dir / shard)))
        return state
    if (model_dir / "pytorch_model.bin").is_file():
        return torch.load(model_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no model.safetensors(.index.json) or pytorch_model.bin in {model_dir}")


def write_hf_model(state: StateDict, config: dict[str, Any], out_dir: str | Path, *,
                   source_dir: str | Path | None = None) -> Path:
    """Write ``state`` as ``model.safetensors`` with ``config.json``; copy the tokenizer and generation
    config from ``source_dir`` when given."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(out / SAFETENSORS),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if source_dir is not None:
        for name in TOKENIZER_FILES + ("generation_config.json",):
            if (Path(source_dir) / name).is_file():
                shutil.copyfile(Path(source_dir) / name, out / name)
    return out
