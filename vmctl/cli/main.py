"""Entry point of the ``vmctl`` command.

Sub-command groups live in their own modules and are imported only when used (``LazyGroup``), so
``vmctl sim`` does not pay for the daemon client and vice versa. Errors are mapped to exit codes in
one place (``EXIT_CODES``) and printed as ``error: <reference>: message`` plus a hint; a user error
never prints a traceback.

Exit codes: 0 ok; 1 internal error (a bug: traceback printed); 2 usage / bad input; 3 not found;
4 conflict; 5 authentication or permission; 6 daemon or hypervisor unavailable; 7 solver or
operation failed.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from vmctl import errors

#: sub-command name -> "module:attribute"
SUBCOMMANDS: dict[str, str] = {
    "sim": "vmctl.cli.sim:sim",
    "vcsched": "vmctl.cli.vcsched:vcsched",
    "config": "vmctl.cli.config_cmd:config",
    "demo": "vmctl.cli.demo.command:demo",
    "vm": "vmctl.cli.ops:vm",
    "worker": "vmctl.cli.ops:worker",
    "gang": "vmctl.cli.gang:gang",
    "job": "vmctl.cli.ops:job",
    "node": "vmctl.cli.ops:node",
    "migrate": "vmctl.cli.ops:migrate",
    "op": "vmctl.cli.ops:op",
    "events": "vmctl.cli.events:events",
    "top": "vmctl.cli.ops:top",
    "policy": "vmctl.cli.ops:policy",
    "token": "vmctl.cli.ops:token",
    "cert": "vmctl.cli.ops:cert",
    "ca": "vmctl.cli.ops:ca_group",
    "plan": "vmctl.cli.plan:plan_cmd",
    "moldable": "vmctl.cli.moldable:moldable",
    "reproduce": "vmctl.cli.reproduce:reproduce",
}

EXIT_CODES: list[tuple[type[errors.VmctlError], int]] = [
    (errors.NotFound, 3),
    (errors.VmNotFound, 3),
    (errors.Conflict, 4),
    (errors.Unauthenticated, 5),
    (errors.Forbidden, 5),
    (errors.DaemonUnavailable, 6),
    (errors.ClusterUnavailable, 6),
    (errors.HypervisorUnavailable, 6),
    (errors.UserError, 2),
    (errors.SolverError, 7),
    (errors.HypervisorError, 7),
    (errors.VmctlError, 7),
]


def exit_code_for(exc: errors.VmctlError) -> int:
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return 1


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(SUBCOMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            return None
        cmd = getattr(module, attr)
        assert isinstance(cmd, click.Command)
        return cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="vmctl")
def cli() -> None:
    """vmctl: control plane for parallel jobs on two-tier (fg/bg) VMs."""


def report_error(exc: errors.VmctlError) -> int:
    click.echo(f"error: {exc.reference}: {exc.message}", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)
    return exit_code_for(exc)


def main(argv: list[str] | None = None) -> Any:
    try:
        return cli.main(args=argv, prog_name="vmctl", standalone_mode=False)
    except errors.VmctlError as exc:
        sys.exit(report_error(exc))
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
