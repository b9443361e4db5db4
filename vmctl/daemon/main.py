"""``vmctld --config FILE``: the central daemon's console script."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time

from vmctl.errors import VmctlError
from vmctl.sdnotify import Notifier


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vmctld", description="vmctl central daemon (decision loop + HTTP API)")
    p.add_argument("--config", "-c", required=True, help="daemon YAML (see etc/vmctld.yaml)")
    p.add_argument("--check", action="store_true", help="validate the config and exit")
    p.add_argument("--port", type=int, default=None, help="override api.port (0 = any free port)")
    return p


async def serve(config_path: str, port: int | None) -> int:
    from dataclasses import replace

    from vmctl.api.server import DaemonServer
    from vmctl.clock import accelerated_clock
    from vmctl.daemon.config import load_config
    from vmctl.daemon.core import Daemon
    from vmctl.store import open_store

    cfg = load_config(config_path)
    if port is not None:
        cfg = replace(cfg, port=port)
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    store = open_store(cfg.store_url, config_path=cfg.path)
    daemon = Daemon(cfg, store, clock=accelerated_clock(cfg.clock_speed, cfg.clock_epoch))
    if daemon.speed != 1.0:
        logging.getLogger("vmctld").info("accelerated clock: %g model seconds per real second", daemon.speed)
    server = DaemonServer(daemon)
    await server.start()
    # systemd readiness and the port actually bound (tests start us with port 0)
    print(f"vmctld ready port={server.port} leader={daemon.leader}", flush=True)
    notifier = Notifier()
    notifier.ready(f"port {server.port}, leader={daemon.leader}")
    # WATCHDOG=1 only while the decision loop keeps passing (it passes at least every loop.tick_s)
    limit = watchdog_limit(cfg.tick_s)
    notifier.start_watchdog(lambda: daemon_healthy(daemon.last_pass, limit))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        notifier.stopping()
        notifier.close()
    await server.stop()
    store.close()
    return 0


def watchdog_limit(tick_s: float) -> float:
    """Real seconds without a decision-loop pass after which vmctld stops pinging the watchdog."""
    return 3.0 * tick_s + 10.0


def daemon_healthy(last_pass: float, limit: float, now: float | None = None) -> bool:
    """The decision loop passed (``time.monotonic()`` of ``last_pass``) within ``limit`` seconds."""
    return (time.monotonic() if now is None else now) - last_pass < limit


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        if args.check:
            from vmctl.daemon.config import load_config

            cfg = load_config(args.config)
            print(f"{args.config}: ok (policy {cfg.policy_name}, store {cfg.store_url})")
            sys.exit(0)
        sys.exit(asyncio.run(serve(args.config, args.port)))
    except VmctlError as exc:
        print(f"error: {exc.reference}: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        sys.exit(2 if exc.http_status < 500 else 1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
