"""The `splatq redriver` and `splatq tasks` argument parsers (light: `splatq --help` imports
this, and the commands themselves only when they run)."""

from __future__ import annotations

from typing import Any


def add_commands(sub: Any) -> None:
    r = sub.add_parser("redriver", help="run the DLQ redriver and scheduled maintenance")
    r.add_argument(
        "--dry-run", action="store_true", help="print what the policies would do to each entry"
    )
    r.add_argument("--json", action="store_true", help="machine-readable --dry-run output")
    tasks = sub.add_parser("tasks", help="list, run or show the history of scheduled tasks")
    verbs = tasks.add_subparsers(dest="tasks_command", required=True)
    verbs.add_parser("list", help="every task: schedule, last success, next run")
    run = verbs.add_parser("run", help="run a task now (same lock as the schedule)")
    run.add_argument("task", help="the task's name, as `tasks list` prints")
    history = verbs.add_parser("history", help="a task's latest runs")
    history.add_argument("task", help="the task's name, as `tasks list` prints")
    history.add_argument("--limit", type=int, default=20, help="runs to show (default 20)")
    for p in verbs.choices.values():
        p.add_argument("--json", action="store_true", help="machine-readable output")
