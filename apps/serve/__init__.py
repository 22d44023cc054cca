"""`specx serve`: an OpenAI-compatible server (app.py), and the pieces it stands on: the wire
format (protocol.py), admission and worker threads over one shared Pipeline (engine.py), and
Prometheus metrics (metrics.py). Needs the `serve` extra: pip install 'specx[serve]'."""

from specx.apps.serve.app import ServeConfig, Server

__all__ = ["ServeConfig", "Server"]
