"""`splatq --help` is documentation: every command and every argument says what it does, and
the epilogs list the exit codes and the environment variables scripts rely on."""

from __future__ import annotations

import argparse
import io
from collections.abc import Iterator

from splatq.services.cli.client import ProgressLine
from splatq.services.cli.main import _parser
from splatq.shared.client import Event


def _parsers(
    parser: argparse.ArgumentParser, path: str = "splatq"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_argument_of_every_command_has_help() -> None:
    missing = []
    for path, parser in _parsers(_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [
                    f"{path} {c.dest}" for c in action._choices_actions if not (c.help or "")
                ]
            elif not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_the_epilogs_list_exit_codes_and_environment() -> None:
    parsers = dict(_parsers(_parser()))
    for path in ("splatq", "splatq submit", "splatq status", "splatq cancel", "splatq jobs"):
        text = parsers[path].format_help()
        assert "exit codes" in text
        codes = ("0", "2", "3", "4", "78") if path == "splatq jobs" else ("0", "1", "3", "4", "78")
        for code in codes:
            assert f"\n  {code} " in text, (path, code)
        assert "SPLATQ_API_KEY" in text
        assert "SPLATQ_API_URL" in text
    assert "SPLATQ_METRICS_PORT" in parsers["splatq"].format_help()


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _event(kind: str, **data: object) -> Event:
    name = f"3d_reconstruction.{kind}"
    return Event("1-0", name, {"event": name, "data": {"job_id": "job_x", **data}})


def test_the_progress_line_is_rewritten_in_place_and_cleared_before_the_next_line() -> None:
    out = Tty()
    line = ProgressLine(out)
    line.show(_event("started"))
    line.show(_event("progress", progress=0.5, stage="inference"))
    line.show(_event("progress", progress=0.9, stage="write"))
    line.show(_event("completed"))
    line.clear()  # nothing left to clear: writes nothing
    text = out.getvalue()
    assert text.startswith("  started\n\r  [")
    assert text.count("\r  [") == 2
    # the in-place line is erased before the final event's line, which starts a clean line
    assert text.endswith("\r\x1b[2K  completed\n")


def test_without_a_terminal_progress_is_one_line_per_event() -> None:
    out = io.StringIO()
    line = ProgressLine(out)
    line.show(_event("progress", progress=0.5, stage="inference"))
    line.show(_event("completed"))
    line.clear()
    assert "\r" not in out.getvalue()
    assert out.getvalue().splitlines()[-1] == "  completed"
