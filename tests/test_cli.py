"""The command line as a user meets it: help with examples on every command, options in any
position after the command, argument errors as usage errors, read-only commands that leave
nothing behind, quiet pipes, labelled output.

Most tests call `litekiln.cli.main` in this process (capsys); the exit status of a real
process, a real pipe and a fresh home directory need subprocesses (about a second each).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import zoo_model

from litekiln.cli import build_parser, main

REPO = Path(__file__).resolve().parent.parent
SMOKE = str(Path(__file__).parent / "data" / "smoke.tflite")


def _commands(parser: argparse.ArgumentParser, path: list[str]) -> list[list[str]]:
    """Every command and subcommand of the parser, as the words that name it."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += [[*path, name], *_commands(child, [*path, name])]
    return found


ALL_COMMANDS = _commands(build_parser(), [])


def _help(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def _litekiln(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "litekiln.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        **kw,  # type: ignore[call-overload]
    )


# ---------------------------------------------------------------------------- help


def _examples(text: str) -> list[str]:
    """The example lines of a help text (as typed in a shell)."""
    lines = text.split("\nexamples:\n", 1)[1].splitlines()
    return [ln for ln in lines if ln.startswith("  ") and "litekiln " in ln]


@pytest.mark.parametrize("argv", ALL_COMMANDS, ids=" ".join)
def test_every_command_help_has_examples(capsys: pytest.CaptureFixture[str], argv) -> None:
    text = _help(capsys, argv)
    assert "\nexamples:\n" in text, text
    examples = _examples(text)
    assert 2 <= len(examples) <= 4 if len(argv) == 1 else 1 <= len(examples) <= 4, text


def test_examples_parse(capsys: pytest.CaptureFixture[str]) -> None:
    """Every example is a valid command line (the files it names are stand-ins)."""
    parser = build_parser()
    _accept_any_file(parser)
    for argv in ALL_COMMANDS:
        for line in _examples(_help(capsys, argv)):
            for segment in line.split("#")[0].split("|")[0].split("&&"):
                words = shlex.split(segment)
                while words and "=" in words[0]:  # VAR=value litekiln ...
                    words.pop(0)
                assert words[0] == "litekiln", line
                assert parser.parse_args(words[1:]).func, line


def _accept_any_file(parser: argparse.ArgumentParser) -> None:
    from litekiln.cli.common import existing_file

    for action in parser._actions:
        if action.type is existing_file:
            action.type = str
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _accept_any_file(child)


# ---------------------------------------------------------------------------- positions


@pytest.mark.parametrize(
    "one, other",
    [
        (["inspect", SMOKE, "--json"], ["inspect", "--json", SMOKE]),
        (["inspect", SMOKE, "--ops", "-v"], ["-v", "inspect", "--ops", SMOKE]),
        (
            ["run", "--seed", "3", SMOKE, "--device", "reference"],
            ["run", SMOKE, "--seed=3", "--device=reference"],
        ),
        (
            ["bench", SMOKE, "--runs", "5", "--startup"],
            ["bench", "--startup", "--runs", "5", SMOKE],
        ),
        (["compile", SMOKE, "--force", "--verbose"], ["--verbose", "compile", "--force", SMOKE]),
        (
            ["cache", "--cache-dir", "D", "ls", "--json"],
            ["cache", "ls", "--json", "--cache-dir", "D"],
        ),
        (["-v", "cache", "ls"], ["cache", "ls", "-v"]),
        (["devices", "--json", "-v"], ["-v", "devices", "--json"]),
        (["config", "-v", "--json"], ["config", "--json", "--verbose"]),
    ],
)
def test_options_anywhere_after_the_command(one: list[str], other: list[str]) -> None:
    parser = build_parser()
    assert vars(parser.parse_args(one)) == vars(parser.parse_args(other))


@pytest.mark.parametrize("argv", ALL_COMMANDS, ids=" ".join)
def test_verbose_in_every_position(argv: list[str]) -> None:
    parser = build_parser()
    if argv == ["cache"]:
        argv = ["cache", "ls"]
    rest = _positionals(parser, argv)
    assert parser.parse_args([*argv, *rest]).verbose is False
    assert parser.parse_args(["-v", *argv, *rest]).verbose is True
    assert parser.parse_args([*argv, *rest, "-v"]).verbose is True


def _positionals(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Stand-ins for the required positional arguments of the command `argv` names."""
    for word in argv:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return [
        SMOKE
        for a in parser._actions
        if not a.option_strings
        and not isinstance(a, argparse._SubParsersAction)
        and a.nargs not in ("*", "?")
    ]


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "argv, message",
    [
        (["inspect", "no-such-model.tflite"], "argument MODEL: no such file"),
        (["run", SMOKE, "--seed", "-1"], "argument --seed: expected an integer >= 0"),
        (["run", SMOKE, "--inputs", "no-such.npz"], "argument --inputs: no such file"),
        (["run", SMOKE, "--save", "/no/such/dir/out.npz"], "argument --save:"),
        (["bench", SMOKE, "--runs", "0"], "argument --runs: expected an integer >= 1"),
        (["bench", SMOKE, "--repeat", "x"], "argument --repeat: expected an integer"),
        (["bench", SMOKE, "--plot", "/no/such/dir/p.png"], "argument --plot:"),
        (["bench", SMOKE, "--peak-gbps", "0"], "argument --peak-gbps: expected a number above 0"),
        (["compile", SMOKE, "--max-partitions", "-1"], "argument --max-partitions:"),
        (["compile", SMOKE, "--fp16-budget", "2"], "argument --fp16-budget:"),
        (["compile", SMOKE, "--jobs", "-1"], "argument --jobs/-j: expected an integer >= 0"),
        (["inspect", SMOKE, "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_argument_errors_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith(f"usage: litekiln {argv[0]}"), err
    assert f"litekiln {argv[0]}: error: {message}" in err, err
    assert "Traceback" not in err


def test_option_types() -> None:
    from litekiln.cli.common import existing_file, int_at_least, output_file

    assert int_at_least(0)("0") == 0
    with pytest.raises(argparse.ArgumentTypeError):
        int_at_least(1)("1.5")
    with pytest.raises(argparse.ArgumentTypeError, match="no such file"):
        existing_file("/no/such/file")
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        output_file("/no/such/dir/file")
    assert output_file("out.npz") == "out.npz"


def test_bad_environment_is_an_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITEKILN_PRECISION", "fp64")
    assert main(["inspect", SMOKE]) == 2
    err = capsys.readouterr().err
    assert err.startswith("litekiln: error: LITEKILN_PRECISION='fp64'"), err
    assert main(["config"]) == 0  # config shows it instead
    assert "invalid" in capsys.readouterr().out


def test_exit_status_of_a_usage_error_process() -> None:
    p = _litekiln("bench", SMOKE, "--runs", "none")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("usage: litekiln bench") and "Traceback" not in p.stderr


# ---------------------------------------------------------------------------- read-only


READ_ONLY = [
    ["inspect", SMOKE],
    ["inspect", "--compiled", "--ops", "--json", SMOKE],
    ["devices"],
    ["config"],
    ["run", "--device", "reference", SMOKE],
    ["run", "--no-cache", "--device", "reference", SMOKE],
    pytest.param(["run", "--no-cache", SMOKE], marks=[pytest.mark.opencl, pytest.mark.slow]),
]


@pytest.mark.parametrize("argv", READ_ONLY, ids=lambda a: " ".join(a).replace(SMOKE, "MODEL"))
def test_read_only_commands_create_nothing(tmp_path: Path, argv: list[str]) -> None:
    """In a fresh home: no litekiln cache, no pyopencl/pytools cache, no driver cache, no
    scratch left in the temp folder."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LITEKILN_", "POCL_"))}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), TMPDIR=str(tmp))
    env.pop("PYOPENCL_NO_CACHE", None)
    p = _litekiln(*argv, env=env)
    assert p.returncode == 0, p.stderr
    left = sorted(str(f.relative_to(tmp_path)) for f in tmp_path.rglob("*"))
    assert left == ["home", "tmp"], left
    # Nothing is stored, so an OpenCL run waits for its build and runs on the device: no
    # build left to the exit, where its scratch folder was gone (the build failed there).
    assert "failed" not in p.stderr and "stays on the CPU" not in p.stderr, p.stderr
    if argv[0] == "run" and "reference" not in argv:
        assert "on the CPU (numpy) while" not in p.stdout, p.stdout


# ---------------------------------------------------------------------------- pipes


@pytest.mark.parametrize(
    "argv",
    [["inspect", "--ops", SMOKE], ["cache", "ls", "--cache-dir", "{tmp}"], ["config"]],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path, argv: list[str]) -> None:
    """`litekiln ... | head -1`, where head has gone before the first write: no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "litekiln.cli", *(w.format(tmp=tmp_path / "c") for w in argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before litekiln has started
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == ""


def test_head_of_a_pipe() -> None:
    cmd = f"set -o pipefail; {sys.executable} -m litekiln.cli inspect --ops {SMOKE} | head -1"
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 141)
    assert p.stdout.startswith(f"{SMOKE}: token ") and p.stdout.count("\n") == 1
    assert p.stderr == ""


def test_broken_pipe_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    class Gone:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Gone())
    assert main(["config"]) == 141


# ---------------------------------------------------------------------------- output


def test_inspect_counts_the_ops_folded_at_load(capsys: pytest.CaptureFixture[str]) -> None:
    path = zoo_model("face_detection_short_range")  # fp16 weights: 74 DEQUANTIZE folded
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "folded at load" in out and "DEQUANTIZE x74" in out, out


def test_run_labels_its_times(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", SMOKE, "--device", "reference"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "loaded in" in first and "ms" in first and "inference" in first, first


def test_cli_reference_is_generated_from_the_parser() -> None:
    """docs/cli.md is `scripts/gen_docs.py`'s output for the parser as it is."""
    gen = runpy.run_path(str(REPO / "scripts" / "gen_docs.py"))
    assert (REPO / "docs" / "cli.md").read_text() == gen["cli_md"]()


def test_inspect_view_writes_the_page_and_the_explorer_data(tmp_path: Path) -> None:
    page, data = tmp_path / "smoke.html", tmp_path / "smoke.json"
    assert main(["inspect", SMOKE, "--view", str(page), "--explorer", str(data)]) == 0
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html and "CONV_2D" in html
    assert json.loads(data.read_text())  # node data, checked in detail by tests/test_view.py
