"""Make a tiny Qwen2-architecture causal LM and a byte-level BPE tokenizer, saved in Hugging Face format.

No causal LM can be downloaded on the machines this project is built on, so the embedded default
makes its own. The result loads with ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained``,
the same calls that load ``Qwen/Qwen2.5-3B-Instruct``.

    python toolkits/make_tiny_model.py --out outputs/tiny-qwen2 --text tests/data/hotpotqa_100/corpus.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

# The protocol tags are single tokens, so the model emits a stop tag in one step and stop checks are exact.
PROTOCOL_TAGS = ("<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>",
                 "<information>", "</information>")
# With --tool-calling, the function-calling tags are single tokens too (Qwen2.5 has <tool_call> and </tool_call> as
# tokens of their own), so a call's frame costs the tiny model a few ids.
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
# Qwen2.5's special tokens, so chat templating and EOS handling match the real model family.
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

# The template's words around the tool schemas (shorter than Qwen2.5's: every prompt of a tiny model on a CPU pays
# for them), in one place so the tokenizer can be trained on them (--tool-calling).
TOOLS_INTRO = "# Tools\n\nFunctions you can call:\n<tools>"
TOOLS_OUTRO = ("\n</tools>\n\nTo call one, write:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>")
# ChatML, as Qwen2.5 uses it, without the default system prompt. With ``tools=[...]`` it also renders what a
# function-calling model needs, in the layout of Qwen2.5's own template (our wording): the tool schemas in a
# system turn, each call an assistant wrote as <tool_call> JSON, and consecutive ``tool`` messages as
# <tool_response> blocks of one user turn. Without tools or tool messages it renders exactly plain ChatML.
CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- " + json.dumps(TOOLS_INTRO) + " }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- " + json.dumps(TOOLS_OUTRO + IM_END + "\n") + " }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- if call['function'] is defined %}{%- set call = call['function'] %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' + (call['arguments'] | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Size of the tiny model; the defaults make about 1 M parameters with a 2 k vocabulary."""

    vocab_size: int = 2048
    """BPE vocabulary size including special and protocol tokens."""
    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 2
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention, as in Qwen2.5)."""
    intermediate_size: int = 384
    """MLP width."""
    max_positions: int = 4096
    """Longest sequence (prompt + response) the model accepts."""
    seed: int = 0
    """Initialisation seed: the same spec and seed give the same weights."""


def _texts_from_files(paths: list[Path]) -> Iterator[str]:
    """Yield training text: ``contents``/``question``/``text`` fields of jsonl rows, or raw lines."""
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    yield line
                    continue
                if isinstance(record, dict):
                    for key in ("contents", "question", "text", "prompt"):
                        if isinstance(record.get(key), str):
                            yield record[key]
                    answers = record.get("golden_answers")
                    if isinstance(answers, list):
                        yield " ".join(str(a) for a in answers)


def train_tokenizer(texts: Iterator[str], vocab_size: int, *, tags: tuple[str, ...] = PROTOCOL_TAGS):
    """Train a byte-level BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast``, ``tags`` added as tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=IM_END, pad_token=ENDOFTEXT, bos_token=None,
        unk_token=None, model_max_length=32768,
    )
    # Added, not special: they must survive decode(skip_special_tokens=True) as text.
    tokenizer.add_tokens(list(tags))
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_model(spec: TinyModelSpec, tokenizer):
    """A randomly initialised Qwen2ForCausalLM sized by ``spec``, with the tokenizer's ids."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(spec.seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size, max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[config.eos_token_id, tokenizer.convert_tokens_to_ids(ENDOFTEXT)],
        pad_token_id=config.pad_token_id,
    )
    return model


def _prompt_template_texts(copies: int = 50) -> Iterator[str]:
    """The built-in prompt templates, repeated as often as a prompt would be seen in training, so
    the instruction that heads every prompt becomes a few dozen tokens rather than hundreds of pieces."""
    from rlinf_search.data.prompts import PLACEHOLDER, TEMPLATES

    for template in TEMPLATES.values():
        if template != PLACEHOLDER:
            yield from [template.replace(PLACEHOLDER, "")] * copies


def _tool_calling_texts(copies: int = 50) -> Iterator[str]:
    """What every function-calling prompt and call repeats: the tool system turn with the built-in search schema,
    a call's JSON frame and a tool response's frame, as often as the prompt templates."""
    from rlinf_search.agents.tools.search_function import DEFAULT_SEARCH_SCHEMA

    system = f"{TOOLS_INTRO}\n{json.dumps(DEFAULT_SEARCH_SCHEMA)}{TOOLS_OUTRO}"
    call = '<tool_call>\n{"name": "search", "arguments": {"query_list": [""]}}\n</tool_call>'
    response = "\n<tool_response>\nDoc 1(Title: )\n</tool_response>"
    roles = "system\nuser\nassistant\n"  # the chat template's role names, which every turn's header spells
    for text in (system, call, response, roles):
        yield from [text] * copies


def make_tiny_model(out: Path, text_files: list[Path], spec: TinyModelSpec = TinyModelSpec(), *,
                    tool_calling: bool = False) -> Path:
    """Train the tokenizer on ``text_files`` and the prompt templates, build the model, and save both to ``out``.
    ``tool_calling``: the function-calling tags become tokens and the tokenizer learns the tool turn's text too
    (``agent.protocol: toolcall``); without it the tokenizer is exactly the one the Search-R1 demo was tuned on."""
    texts = itertools.chain(_texts_from_files(text_files), _prompt_template_texts())
    tags = PROTOCOL_TAGS
    if tool_calling:
        texts, tags = itertools.chain(texts, _tool_calling_texts()), PROTOCOL_TAGS + TOOL_TAGS
    tokenizer = train_tokenizer(texts, spec.vocab_size - len(tags), tags=tags)
    model = build_model(spec, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="model directory to write")
    parser.add_argument("--text", required=True, help="comma-separated text/jsonl files to train the tokenizer on")
    parser.add_argument("--vocab-size", type=int, default=TinyModelSpec.vocab_size)
    parser.add_argument("--hidden-size", type=int, default=TinyModelSpec.hidden_size)
    parser.add_argument("--num-layers", type=int, default=TinyModelSpec.num_layers)
    parser.add_argument("--num-heads", type=int, default=TinyModelSpec.num_heads)
    parser.add_argument("--num-kv-heads", type=int, default=TinyModelSpec.num_kv_heads)
    parser.add_argument("--intermediate-size", type=int, default=TinyModelSpec.intermediate_size)
    parser.add_argument("--seed", type=int, default=TinyModelSpec.seed)
    parser.add_argument("--tool-calling", action="store_true",
                        help="for agent.protocol toolcall: <tool_call>, </tool_call>, <tool_response> and "
                             "</tool_response> as tokens, and the tool turn's text in the tokenizer's training")
    args = parser.parse_args(argv)
    files = [Path(p) for p in args.text.split(",")]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        print(f"make_tiny_model: text file(s) not found: {', '.join(missing)}", file=sys.stderr)
        return 1
    spec = TinyModelSpec(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                         num_layers=args.num_layers, num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
                         intermediate_size=args.intermediate_size, seed=args.seed)
    out = make_tiny_model(Path(args.out), files, spec, tool_calling=args.tool_calling)
    print(f"wrote a tiny Qwen2 model and tokenizer to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
