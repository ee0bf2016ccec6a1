"""The credentials and TLS files a client command of a secured NATS takes from the environment (a module of its own:
the CLI imports it at start, before anything of the bus)."""

from __future__ import annotations

CLIENT_ENV = {"user": "INFERBUS_NATS_USER", "password": "INFERBUS_NATS_PASSWORD", "token": "INFERBUS_NATS_TOKEN",
              "nkeys_seed": "INFERBUS_NATS_NKEY_SEED", "user_credentials": "INFERBUS_NATS_CREDS",
              "tls_ca_file": "INFERBUS_NATS_TLS_CA", "tls_cert_file": "INFERBUS_NATS_TLS_CERT",
              "tls_key_file": "INFERBUS_NATS_TLS_KEY"}
"""The client commands' (``infer``, ``models``, ``health``, ``bench`` and its load-generator processes,
``region``, ``cluster``) credentials and TLS files for a secured NATS: :class:`~inferbus.bus.BusConfig` field →
environment variable (the first three are also ``inferbus up``'s)."""


def client_env_options(environ=None) -> dict[str, str]:
    """The :class:`~inferbus.bus.BusConfig` fields :data:`CLIENT_ENV` sets in ``environ`` (default ``os.environ``; a
    variable that is empty is not set), e.g. ``{"token": "..."}``."""
    import os

    env = os.environ if environ is None else environ
    return {name: env[var] for name, var in CLIENT_ENV.items() if env.get(var)}
