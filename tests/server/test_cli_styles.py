"""Flag preflight for every CLI style (argparse, click, typer's rich help) and a server's own usage error at
start, read from real programs: the click front-end of the stand-in (``click_server.py``) and a typer program."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from search_spaces import Hardware, load_space_text, resolve
from tuner.measurement import Outcome, exception_line
from tuner.targets.server import flags as fl
from tuner.targets.server.launch import usage_error

CLICK_SERVER = Path(__file__).with_name("click_server.py")

TYPER_PROGRAM = """
from enum import Enum
from typing import Optional
import typer

class Reasoning(str, Enum):
    on = "on"
    off = "off"
    auto = "auto"

def serve(force_model: Optional[str] = typer.Argument(None),
          continuous_batching: bool = typer.Option(False, "--continuous-batching/--no-continuous-batching",
                                                   help="Enable continuous batching."),
          reasoning: Reasoning = typer.Option(Reasoning.auto, help="Reasoning mode."),
          cb_block_size: Optional[int] = typer.Option(None, help="KV cache block size."),
          port: int = typer.Option(..., "--port", "-p", help="Port."),
          verbose: bool = typer.Option(False, "--verbose", "-v")):
    pass

typer.run(serve)
"""

CLICK_SPACE = """
name: click-standin
target: command
objective: {metric: tok_s, combine: geomean, levels: [1, 2]}
params:
  continuous_batching: {type: bool, default: false, flag: --continuous-batching}
  reasoning: {type: categorical, values: [auto, "on", "off"], default: auto, flag: --reasoning}
"""


def _click_target(tmp_path, yaml=CLICK_SPACE, **settings):
    from tuner.targets.server.target import CommandTarget

    space = resolve(load_space_text(yaml, source="click.yaml"), Hardware())
    base = {
        "command": [sys.executable, str(CLICK_SERVER), "--host", "{host}", "--port", "{port}"],
        "model": "standin",
        "port_range": "32000-32999",
        "prompt_len": 8,
        "output_len": 8,
        "min_requests": 2,
        "rounds": 1,
        "warmup_requests": 0,
        "teardown_reserve_s": 3.0,
    }
    base.update(settings)
    return CommandTarget(space, base)


def test_click_help_reads_both_halves_of_a_boolean_pair_choice_lists_and_values():
    flags = fl.help_flags([sys.executable, str(CLICK_SERVER), "--help"])
    on, off = flags.get("--continuous-batching"), flags.get("--no-continuous-batching")
    assert on is not None and off is not None and on is not off
    assert not on.takes_value and not off.takes_value
    assert flags.get("--reasoning").choices == ("on", "off", "auto")
    assert flags.get("--cb-block-size").takes_value and flags.get("--cb-block-size").choices is None
    assert flags.get("--no-enable-cors") is not None
    assert flags.check_value("--reasoning", "sometimes") is not None


def test_typer_rich_help_reads_pairs_choices_short_aliases_and_bool_switches(tmp_path):
    prog = tmp_path / "typer_server.py"
    prog.write_text(TYPER_PROGRAM)
    flags = fl.help_flags([sys.executable, str(prog), "--help"])
    assert not flags.get("--continuous-batching").takes_value
    assert not flags.get("--no-continuous-batching").takes_value
    assert flags.get("--reasoning").choices == ("on", "off", "auto")
    assert flags.get("-p") is flags.get("--port") and flags.get("--port").takes_value
    assert not flags.get("--verbose").takes_value  # typer prints <bool> for a switch
    assert flags.get("--cb-block-size").takes_value


def test_argparse_help_still_reads_choices_lists_and_aliases():
    text = """usage: x [-h]
options:
  -h, --help            show this help message and exit
  -p PORT, --port PORT  the port
  --kv-cache-dtype {auto,fp8_e4m3}
  --bs BS [BS ...]      sizes
  --fast                a switch
"""
    flags = fl.parse_help_text(text)
    assert flags.get("-p") is flags.get("--port") and flags.get("--port").takes_value
    assert flags.get("--kv-cache-dtype").choices == ("auto", "fp8_e4m3")
    assert flags.get("--bs").is_list
    assert not flags.get("--fast").takes_value


def test_preflight_accepts_the_no_half_of_a_click_pair_and_a_bool_param_on_the_pair(tmp_path):
    report = _click_target(tmp_path, extra_args=["--no-enable-cors"]).preflight()
    assert report.ok, "\n".join(report.lines())
    assert any("3 of 3 flags accepted" in line for line in report.will_run), report.will_run


def test_preflight_refuses_a_value_outside_a_click_choice_list(tmp_path):
    yaml = CLICK_SPACE.replace('values: [auto, "on", "off"]', 'values: [auto, "on", sometimes]')
    report = _click_target(tmp_path, yaml=yaml).preflight()
    assert any("'sometimes' is not one of the choices of --reasoning" in e for e in report.errors), report.errors


def test_preflight_says_yaml_read_an_unquoted_on_as_a_boolean(tmp_path):
    yaml = CLICK_SPACE.replace('values: [auto, "on", "off"]', "values: [auto, on, off]")
    report = _click_target(tmp_path, yaml=yaml).preflight()
    assert any("'true' is not one of the choices" in e and 'quote it ("on")' in e for e in report.errors), report.errors


def test_server_usage_error_at_start_is_invalid_config_with_the_servers_message(tmp_path):
    target = _click_target(tmp_path, extra_args=["--bogus-option"], help_command=[])
    m = target.evaluate({"continuous_batching": False, "reasoning": "auto"}, time.time() + 30)
    assert m.outcome is Outcome.INVALID_CONFIG, m.reason
    assert "No such option '--bogus-option'" in m.reason


def test_argparse_usage_error_at_start_is_invalid_config_with_its_error_line(make_target):
    m = make_target(["--no-such-flag", "1"], help_command=[]).evaluate(
        {"context_length": 8192, "kv_cache_dtype": "auto", "buckets": "pow2:8", "fast_path": False}, time.time() + 30
    )
    assert m.outcome is Outcome.INVALID_CONFIG, m.reason
    assert "error: unrecognized arguments: --no-such-flag 1" in m.reason


def test_usage_error_reads_click_argparse_and_typer_boxes_and_nothing_else():
    assert (
        usage_error("Usage: s [OPTIONS]\nTry 's --help' for help.\n\nError: No such option: --x\n")
        == "Error: No such option: --x"
    )
    assert (
        usage_error("usage: s [-h]\ns: error: argument --tp: invalid int value: 'x'\n")
        == "s: error: argument --tp: invalid int value: 'x'"
    )
    boxed = (
        "Usage: s [OPTIONS]\nTry 's --help' for help.\n╭─ Error ───────────╮\n│ No such option: --x │\n"
        "╰───────────────────╯\n"
    )
    assert usage_error(boxed) == "Error: No such option: --x"
    assert usage_error("Traceback (most recent call last):\n  File 'x'\nValueError: error: bad\n") is None


def test_a_traceback_reason_is_its_exception_line():
    log = (
        'loading\n[rank0]: Traceback (most recent call last):\n[rank0]:   File "x.py", line 1, in <module>\n'
        "[rank0]:     import missing\n[rank0]: ModuleNotFoundError: No module named 'missing'\nexiting\n"
    )
    assert exception_line(log) == "ModuleNotFoundError: No module named 'missing'"
    assert exception_line("no traceback here") is None


def test_a_server_traceback_before_ready_reads_the_exception_line_not_the_header(make_target):
    m = make_target(["--oom-at-start"]).evaluate(
        {"context_length": 8192, "kv_cache_dtype": "auto", "buckets": "pow2:8", "fast_path": False}, time.time() + 30
    )
    assert m.outcome is Outcome.OOM, m.reason
    assert "torch.OutOfMemoryError: CUDA out of memory" in m.reason
    assert "Traceback" not in m.reason


def test_a_trial_process_exit_reads_the_exception_line_not_the_last_line():
    from tuner.execution.isolation import describe_exit

    log = 'Traceback (most recent call last):\n  File "x", line 1\nOSError: [Errno 28] No space left\nbye\n'
    assert describe_exit(1, log) == (
        "trial process exited with code 1 without a result: OSError: [Errno 28] No space left"
    )
