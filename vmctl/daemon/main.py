"""``vmctld --config FILE``: the central daemon's console script."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from vmctl.errors import VmctlError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vmctld", description="vmctl central daemon (decision loop + HTTP API)")
    p.add_argument("--config", "-c", required=True, help="daemon YAML (see etc/vmctld.yaml)")
    p.add_argument("--check", action="store_true", help="validate the config and exit")
    p.add_argument("--port", type=int, default=None, help="override api.port (0 = any free port)")
    return p


async def serve(config_path: str, port: int | None) -> int:
    from dataclasses import replace

    from vmctl.api.server import DaemonServer
    from vmctl.daemon.config import load_config
    from vmctl.daemon.core import Daemon
    from vmctl.store import open_store

    cfg = load_config(config_path)
    if port is not None:
        cfg = replace(cfg, port=port)
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    store = open_store(cfg.store_url, config_path=cfg.path)
    daemon = Daemon(cfg, store)
    server = DaemonServer(daemon)
    await server.start()
    # systemd readiness and the port actually bound (tests start us with port 0)
    print(f"vmctld ready port={server.port} leader={daemon.leader}", flush=True)
    _notify("READY=1")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    _notify("STOPPING=1")
    await server.stop()
    store.close()
    return 0


def _notify(state: str) -> None:
    try:
        from vmctl.sdnotify import Notifier
    except ImportError:  # pragma: no cover - shipped together
        return
    Notifier().notify(state)


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
