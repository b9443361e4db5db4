"""The operator commands' helpers under the name they had when all the groups lived here.

Each group of operator commands is its own module (``vmctl.cli.vm``, ``worker``, ``job``, ``node``,
``top``, ``migrate``, ``op``, ``policy``, ``token``, ``cert``, ``ca``; ``vmctl.cli.main`` loads the one
a command needs), on the shared options of ``vmctl.cli.connect`` and the rendering helpers of
``vmctl.cli.render``. The tests and benchmarks that check the formatters, tables and parsers import
them from here; product code imports them from the module that defines them.
"""

from __future__ import annotations

from vmctl.cli.job import explain_text, history_text, parse_shape_option
from vmctl.cli.op import op_text
from vmctl.cli.policy import parse_params
from vmctl.cli.render import (
    RICH_MAX_ROWS,
    Grid,
    fmt_bag_tasks,
    fmt_levels,
    fmt_placement,
    fmt_reason,
    fmt_start,
    fmt_time,
    fmt_workers,
    job_table,
    json_safe,
    kv_table,
    node_table,
    node_text,
    safe_text,
    vm_table,
)
from vmctl.cli.vm import parse_cap
from vmctl.cli.worker import worker_table
from vmctl.files import write_cert_files
from vmctl.timefmt import fmt_duration

__all__ = [
    "RICH_MAX_ROWS", "Grid", "explain_text", "fmt_bag_tasks", "fmt_duration", "fmt_levels", "fmt_placement",
    "fmt_reason", "fmt_start", "fmt_time", "fmt_workers", "history_text", "job_table", "json_safe", "kv_table",
    "node_table", "node_text", "op_text", "parse_cap", "parse_params", "parse_shape_option", "safe_text",
    "vm_table", "worker_table", "write_cert_files",
]
