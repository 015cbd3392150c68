"""One vocabulary: every command's options (walked through typer/click) spell each concept one way,
with the
same parser and the same help wherever the meaning is the same. A second spelling of a concept
(`--train-tokens`
beside `--tokens`, `--world-size` beside `--gpus`, `--runners-up` beside `--top`) fails here."""

import re

import pytest
import typer.main

from planner.cli import COMMANDS, app, load_command

CONCEPTS = {
    # concept: (the one spelling, a pattern every spelling of the concept matches)
    "training tokens": ("--tokens", r"tokens?"),
    "plans shown": ("--top", r"top|runners?-up|alternatives|n-plans|show"),
    "software stack": ("--framework", r"framework|stack"),
    "world size": ("--gpus", r"gpus|world-size|devices|ranks"),
    "nodes": ("--nodes", r"^--(nodes|num-nodes|machines)$"),
    "data-parallel degree": ("--dp", r"^--(dp|data-parallel(-size)?)$"),
    "tensor-parallel degree": ("--tp", r"^--(tp|tensor-parallel(-size)?)$"),
    "pipeline-parallel degree": ("--pp", r"^--(pp|pipeline-parallel(-size)?)$"),
    "context-parallel degree": ("--cp", r"^--(cp|context-parallel(-size)?)$"),
    "expert-parallel degree": ("--ep", r"^--(ep|expert-parallel(-size)?)$"),
    "shard group": ("--dp-shard", r"shard"),
    "price": ("--price-per-hour", r"price|usd|dollar"),
    "spot pricing": ("--spot", r"^--spot$|preemptible"),
    "global batch": ("--global-batch", r"global-batch|batch-size"),
    "sequence length": ("--seq", r"^--(seq|seq-len|sequence-length)$"),
    "precision": ("--precision", r"^--(precision|dtype|mixed-precision)$"),
    "hardware profile": ("--hardware", r"^--(hardware|hw|instance(-type)?)$"),
}
"""The concepts the commands share, each with its one spelling."""

SAME_HELP = (
    "--tokens",
    "--top",
    "--framework",
    "--gpus",
    "--nodes",
    "--price-per-hour",
    "--global-batch",
    "--seq",
)
"""Options whose meaning is the same in every command that has them: the same help text (so the same
default
stated) and the same parser. (--cp, --ep, --dp-shard are one degree in `estimate` and a search pin
in `recommend`
and `report`: their help differs with that, their name and type do not.)"""


def commands(group=None, path=()):
    group = group or typer.main.get_command(app)
    for name, command in group.commands.items():
        if not path and name in COMMANDS:  # the root lists them unloaded (planner.cli.COMMANDS)
            command = load_command(name)
        if hasattr(command, "commands"):
            yield from commands(command, path + (name,))
        else:
            yield " ".join(path + (name,)), command


def options():
    """(command, option name, click parameter) for every long option of every command."""
    return [
        (cmd, opt, param)
        for cmd, command in commands()
        for param in command.params
        for opt in param.opts + param.secondary_opts
        if opt.startswith("--")
    ]


def test_every_concept_has_one_spelling():
    seconds = [
        (cmd, opt, concept)
        for cmd, opt, _ in options()
        for concept, (one, pattern) in CONCEPTS.items()
        if opt != one and re.search(pattern, opt) and not _other_concept(opt)
    ]
    assert seconds == []


def _other_concept(opt: str) -> bool:
    """Options that match a pattern but name another concept (the maximum of a searched degree, the
    spot reclaim
    rate, the price-free --json): listed so that the test states what it allows."""
    return opt in ("--max-cp", "--max-ep", "--spot-interruptions-per-node-hour", "--expert-tp")


@pytest.mark.parametrize("name", SAME_HELP)
def test_a_shared_option_has_one_parser_and_one_help(name):
    found = [(cmd, param) for cmd, opt, param in options() if opt == name]
    assert len(found) >= 2, f"{name} is in one command only"
    helps = {" ".join((param.help or "").split()) for _, param in found}
    types = {
        (param.is_flag, param.type_descriptor.annotation) for _, param in found
    }  # one parser (ranges may differ)
    assert len(helps) == 1, (name, [cmd for cmd, _ in found], helps)
    assert len(types) == 1, (name, types)


def test_precision_takes_the_same_values_everywhere():
    """--precision: the same values in every command (the default differs: `profile` has no device
    to pick by)."""
    helps = {" ".join(p.help.split()) for _, opt, p in options() if opt == "--precision"}
    assert len(helps) >= 1 and all(
        h.startswith("fp32, amp-bf16, amp-fp16, bf16 or fp8") for h in helps
    )


def test_tokens_parse_the_same_units_everywhere():
    """`--tokens 1T` and `--tokens 300B` are accepted by every command that takes tokens (report
    took only
    plain numbers under another name)."""
    from typer.testing import CliRunner

    runner = CliRunner()
    takers = sorted({cmd for cmd, opt, _ in options() if opt == "--tokens"})
    assert takers == ["recommend", "report"]
    for cmd in takers:
        result = runner.invoke(
            app,
            [
                cmd,
                "gpt2",
                "--hardware",
                "p4d.24xlarge",
                "--gpus",
                "8",
                "--tokens",
                "1Q",
                *(["--out", "unused"] if cmd == "report" else []),
            ],
        )
        assert result.exit_code == 2 and "tokens='1Q'" in result.stderr and "300B" in result.stderr


def test_framework_help_states_the_real_defaults():
    from planner.sources import default_framework

    helps = {" ".join(p.help.split()) for _, opt, p in options() if opt == "--framework"}
    assert len(helps) == 1
    (help_text,) = helps
    assert (
        default_framework("gpt3-175b", None) == "megatron"
        and "megatron for a catalog name" in help_text
    )
    assert (
        default_framework("m.mod:factory", None) == "fsdp"
        and "fsdp for a config.json or module factory" in help_text
    )
    assert "a plan file's own" in help_text


def concept_list() -> list[str]:
    """The concepts this test holds to one spelling (printed in the issue's closing note)."""
    return [f"{concept}: {one}" for concept, (one, _) in CONCEPTS.items()]
