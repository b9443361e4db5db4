"""The API's handlers, one class per group of routes (``vmctl.api.server.DaemonServer.make_app``
wires them)."""
