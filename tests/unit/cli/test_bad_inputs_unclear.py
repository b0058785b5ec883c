"""Bad input that was accepted and then failed at start in a traceback, or refused in a message that
did not say what was wrong (issue 49): a model that is no causal language model (an encoder, an
encoder-decoder), of no layers, or whose folder lacks the tokenizer's chat template; `~user` in a path
for a user this machine does not have; JSON on the command line with escapes, or not JSON at all; a
regex that starts with "[" (read as a list, and garbled); and
`lorarl-inference`, which started vLLM on a model `rl` would refuse. Each is refused in one line naming
the key, file or value, nothing written (`bad_inputs.assert_refused`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

import pytest

from lorarl.config.loader import ConfigError, load_config, load_run
from lorarl.config.run import RLConfig, RLRunMode
from tests.unit.cli.bad_inputs import Case, Workspace, assert_refused, case_ids, merge_args, rl_args, sft_args

NO_USER = "lorarl-no-such-user"


@pytest.fixture(scope="module", autouse=True)
def models(ws: Workspace) -> None:
    """Copies of the workspace's model under unclear/, each with one thing wrong."""
    config = json.loads((ws.model / "config.json").read_text())

    def copy(name: str, drop: tuple[str, ...] = (), **changes: object) -> None:
        folder = ws.root / "unclear" / name
        shutil.copytree(ws.model, folder, ignore=shutil.ignore_patterns(*drop))
        (folder / "config.json").write_text(json.dumps({**config, **changes}))

    copy("encoder", model_type="bert", architectures=["BertModel"])
    copy("classifier", model_type="bert", architectures=["BertForSequenceClassification"])
    copy("seq2seq", model_type="t5", architectures=["T5ForConditionalGeneration"])
    copy("bart", model_type="bart", architectures=["BartForConditionalGeneration"], is_encoder_decoder=True)
    copy("no-layers", num_hidden_layers=0)
    copy("minus-layers", num_hidden_layers=-2)
    copy("no-template", drop=("chat_template.jinja",))
    copy("no-tokenizer", drop=("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"))


def on(model: str, *more: str) -> Callable[[Workspace], list[str]]:
    return rl_args("--model.name", f"{{w.root}}/unclear/{model}", *more)


def sft_on(model: str) -> Callable[[Workspace], list[str]]:
    return sft_args("--model.name", f"{{w.root}}/unclear/{model}", "--dry-run")


def merge_on(model: str) -> Callable[[Workspace], list[str]]:
    return merge_args(f"{{w.root}}/unclear/{model}", "{w.adapter}", f"{{w.root}}/unclear/merged-{model}")


def inference(*more: str) -> Callable[[Workspace], list[str]]:
    """`lorarl-inference --dry-run`: prints the vLLM command it would exec."""
    return lambda w: [a.replace("{w.root}", str(w.root)) for a in ["--model.name", str(w.model), *more, "--dry-run"]]


NOT_CAUSAL = "not a causal language model"
NO_TEMPLATE = "has no chat template"
CASES: list[Case] = [
    # Not a causal LM: was "target_modules adapts no module", or "model.attn_implementation = ...".
    ("rl", on("encoder"), f"encoder/config.json describes BertModel (model_type 'bert'), {NOT_CAUSAL}"),
    ("rl", on("classifier"), f"BertForSequenceClassification (model_type 'bert'), {NOT_CAUSAL}"),
    ("rl", on("seq2seq"), f"T5ForConditionalGeneration (model_type 't5'), {NOT_CAUSAL}"),
    ("rl", on("bart"), f"BartForConditionalGeneration (model_type 'bart'), {NOT_CAUSAL}"),
    ("sft", sft_on("encoder"), "model.name: {w.root}/unclear/encoder/config.json describes BertModel"),
    ("lorarl-merge", merge_on("seq2seq"), "--base: {w.root}/unclear/seq2seq/config.json describes T5"),
    ("lorarl-inference", inference("--model.name", "{w.root}/unclear/encoder"), NOT_CAUSAL),
    # A model of no layers: was a validator's name ("validate_layer_type").
    ("rl", on("no-layers"), "no-layers/config.json has num_hidden_layers = 0: a model of no layers"),
    ("sft", sft_on("minus-layers"), "minus-layers/config.json has num_hidden_layers = -2"),
    ("lorarl-merge", merge_on("no-layers"), "--base: {w.root}/unclear/no-layers/config.json has num_hidden_layers"),
    # No chat template (or no tokenizer files, which transformers loads as a tokenizer of one token):
    # rl's dry run ended in a traceback, sft passed it, lorarl-merge wrote a model with no template.
    ("rl", on("no-template"), f"model.name: the tokenizer in {{w.root}}/unclear/no-template {NO_TEMPLATE}"),
    ("rl", on("no-tokenizer"), f"no-tokenizer {NO_TEMPLATE}"),
    ("sft", sft_on("no-template"), f"no-template {NO_TEMPLATE}"),
    (
        "lorarl-merge",
        merge_on("no-tokenizer"),
        f"--base: the tokenizer in {{w.root}}/unclear/no-tokenizer {NO_TEMPLATE}",
    ),
    ("lorarl-inference", inference("--model.name", "{w.root}/unclear/no-template"), NO_TEMPLATE),
    # ~user for a user this machine lacks: a traceback (output_dir, data.path), or a folder named so.
    ("rl", rl_args("--output_dir", f"~{NO_USER}/runs"), f"output_dir: ~{NO_USER}/runs: no user '{NO_USER}'"),
    ("rl", rl_args("--model.lora.init_adapter", f"~{NO_USER}"), f"model.lora.init_adapter: ~{NO_USER}: no user"),
    ("rl", rl_args("--model.name", f"~{NO_USER}/qwen"), f"model.name: ~{NO_USER}/qwen: no user '{NO_USER}'"),
    ("sft", sft_args(data=f"~{NO_USER}/chat.jsonl"), f"data.path: ~{NO_USER}/chat.jsonl: no user '{NO_USER}'"),
    ("sft", sft_args("--data.eval_path", f"~{NO_USER}/eval.jsonl"), f"data.eval_path: ~{NO_USER}/eval.jsonl: no"),
    ("lorarl-merge", merge_args(out=f"~{NO_USER}/merged"), f"~{NO_USER}/merged: no user '{NO_USER}'"),
    ("lorarl-merge", merge_args(adapter=f"~{NO_USER}/adapter"), f"~{NO_USER}/adapter: no user '{NO_USER}'"),
    ("lorarl-plot", lambda w: [f"~{NO_USER}/run"], f"~{NO_USER}/run: no user '{NO_USER}'"),
    ("lorarl-plot", lambda w: [str(w.out / "previous"), "--out", f"~{NO_USER}"], f"~{NO_USER}: no user"),
    ("lorarl-trainer", lambda w: ["--model.name", str(w.model), "--output_dir", f"~{NO_USER}"], "output_dir: ~"),
    ("lorarl-inference", inference("--model.name", f"~{NO_USER}/m"), f"model.name: ~{NO_USER}/m: no user"),
    # JSON on the command line that is not JSON: was "error parsing value for field orchestrator".
    ("rl", rl_args("--orchestrator.env", "[{'id': 'reverse_text'}]"), "--orchestrator.env: \"[{'id': 'reverse_te"),
    ("rl", rl_args("--orchestrator.env", '[{"id": reverse_text}]'), "--orchestrator.env: '[{\"id\": reverse_text}]'"),
    ("rl", rl_args("--variants", '[{"name": "a",}]'), '--variants: \'[{"name": "a",}]\' is not valid JSON'),
    ("rl", rl_args("--orchestrator.chat_template_kwargs={enable_thinking: false}"), "--orchestrator.chat_template_"),
    # ... and JSON with escapes, read as JSON: an escaped quote in a word (valid, then the env's args).
    (
        "rl",
        rl_args("--orchestrator.env", '[{"id": "reverse_text", "args": {"words": ["say \\"hi\\""], "nope": 1}}]'),
        "args do not fit ReverseText: got an unexpected keyword argument 'nope'",
    ),
    # A regex that starts with "[" for a key that takes a string or a list: pydantic-settings made
    # '[[qk],"_proj"]' of it; now the string typed, which must match whole module paths.
    ("rl", rl_args("--model.lora.target_modules", "[qk]_proj"), "target_modules = '[qk]_proj' adapts no module"),
    ("rl", rl_args("--model.lora.target_modules=[a-z]+_proj"), "target_modules = '[a-z]+_proj' adapts no module"),
    ("sft", sft_args("--model.lora.target_modules", "[qv]_proj", "--dry-run"), "target_modules = '[qv]_proj' adap"),
    (
        "rl",
        rl_args("--model.lora.target_modules", "[qk]_proj", "--model.lora.target_modules", "v_proj"),
        "--model.lora.target_modules: given more than once, once as a string that starts with '['",
    ),
    # lorarl-inference checks the model as rl does before it would start vLLM.
    ("lorarl-inference", inference("--model.name", "{w.root}/no-such-model"), "model.name: {w.root}/no-such-model"),
    ("lorarl-inference", inference("--seq_len", "4096"), "seq_len 4096: "),
    ("lorarl-inference", inference("--model.name", "{w.root}/inputs/chat.jsonl"), "chat.jsonl is a file, not"),
]


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_unclear_or_late_refusals_are_one_clear_line(
    ws: Workspace, capsys: pytest.CaptureFixture[str], case: Case
) -> None:
    command, args, names = case
    assert_refused(ws, capsys, command, args(ws), names.replace("{w.root}", str(ws.root)))


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('[{"id": "reverse_text", "args": {"words": ["say \\"hi\\""]}}]', ['say "hi"']),
        ('[{"id": "reverse_text", "args": {"words": ["C:\\\\data"]}}]', ["C:\\data"]),  # one backslash, not two
        ('[{"id": "reverse_text", "args": {"words": ["tab\\there"]}}]', ["tab\there"]),
    ],
)
def test_json_escapes_on_the_command_line_mean_what_json_says(value: str, words: list[str]) -> None:
    cfg = load_config(RLConfig, ["--model.name", "m", "--orchestrator.env", value])
    assert cfg.orchestrator.env[0].args["words"] == words


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("[qk]_proj|.*\\.v_proj", "[qk]_proj|.*\\.v_proj"),  # a regex: the string typed
        ("[q,k]_proj", "[q,k]_proj"),
        ("[q_proj, v_proj]", ["q_proj", "v_proj"]),  # a list without quotes, as before
        ('["q_proj", "v_proj"]', ["q_proj", "v_proj"]),
        ("q_proj,v_proj", ["q_proj", "v_proj"]),
    ],
)
def test_a_key_that_takes_a_string_or_a_list_keeps_a_regex_that_starts_with_a_bracket(
    value: str, kept: str | list[str]
) -> None:
    cfg = load_config(RLConfig, ["--model.name", "m", "--model.lora.target_modules", value])
    assert cfg.lora.target_modules == kept
    assert (
        load_config(RLConfig, ["--model.name", "m", f"--model.lora.exclude_modules={value}"]).lora.exclude_modules
        == kept
    )


@pytest.mark.parametrize(
    ("flags", "packing", "dry_run"),
    [
        (["--trainer.packing", "false"], False, False),  # TOML's and JSON's spelling
        (["--trainer.packing=False"], False, False),  # Python's
        (["--trainer.packing", "TRUE", "--dry-run", "true"], True, True),
        (["--no-trainer.packing"], False, False),  # the flags as before
        (["--trainer.packing"], True, False),
    ],
)
def test_a_key_that_takes_true_or_false_takes_them_after_its_flag(
    flags: list[str], packing: bool, dry_run: bool
) -> None:
    """`--key false` was refused as "unrecognized arguments: false", without the key: pydantic-settings'
    flags take no value."""
    cfg, mode = load_run(RLConfig, RLRunMode, ["--model.name", "m", "--max_steps", "3", *flags])
    assert (cfg.trainer.packing, mode.dry_run, cfg.max_steps) == (packing, dry_run, 3)


def test_a_key_that_takes_true_or_false_refuses_other_words_after_its_flag() -> None:
    """Refused naming the key (it was "unrecognized arguments: yes")."""
    with pytest.raises(ConfigError, match=r"^--trainer.packing yes: trainer.packing takes true or false, or no value "):
        load_config(RLConfig, ["--model.name", "m", "--trainer.packing", "yes"])


def test_a_list_flag_given_twice_with_an_escaped_json_value_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A list flag given twice is one list of both; read apart, a JSON value with an escape would lose its
    place among them: refused, naming the flag."""
    with pytest.raises(ConfigError, match=r"--inference.extra_args: given more than once, once as JSON"):
        load_config(
            RLConfig, ["--model.name", "m", "--inference.extra_args", '["--a\\\\b"]', "--inference.extra_args=--c"]
        )
    cfg = load_config(RLConfig, ["--model.name", "m", "--inference.extra_args=--a", "--inference.extra_args=--c"])
    assert cfg.inference.extra_args == ["--a", "--c"]
