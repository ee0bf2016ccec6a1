"""``python -m inferbus.cluster node CONFIG_JSON|@FILE``: one region's node process of a local topology (its config
as JSON, or ``@`` and the path of a file holding it: the topology passes a 0600 file, as the config holds its Valkey's
password).

Runs :class:`inferbus.actors.Node` (the region manager first, then aggregator,
workers and ingress) against the region's nats-servers and Valkey, prints READY
once every model is ready (or, without actors, once the region manager is), and
stops the node on SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys


async def _node(cfg_json: str) -> None:
    from ..actors import Node, NodeConfig
    from ..actors._region import RegionConfig
    from ._topology import NodeProcessConfig

    if cfg_json.startswith("@"):
        with open(cfg_json[1:], encoding="utf-8") as fh:
            cfg_json = fh.read()
    c = NodeProcessConfig(**json.loads(cfg_json))
    rc = RegionConfig.from_json(json.dumps(c.region_manager))
    node = Node(NodeConfig(
        models_dir=c.models_dir, models=tuple(c.models), workers=c.workers, ingress=c.ingress,
        nats_url=",".join(c.nats_urls), redis_url=c.redis_url, no_cache=c.redis_url is None, prefix=c.prefix,
        node_id=c.region.lower(), region=c.region, run_dir=c.run_dir, region_manager=rc, actors=c.actors,
        audit=c.audit, health_timeout_s=c.health_timeout_s, l2_lookup=c.l2_lookup, metrics_port=c.metrics_port,
        metrics_host=c.metrics_host, http_infer=c.http_infer, http_model_control=c.http_model_control,
        http_idle_timeout_s=c.http_idle_timeout_s, http_max_connections=c.http_max_connections,
        http_processes=c.http_processes, log_level=c.log_level,
        log_format=c.log_format, bus_extra={"dont_randomize": True}))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await node.start()
    try:
        if c.actors:
            await node.wait_ready(120)
        print("READY", flush=True)
        await stop.wait()
    finally:
        await node.stop()


def _main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] != "node":
        sys.exit("usage: python -m inferbus.cluster node CONFIG_JSON|@FILE")
    try:
        import uvloop

        uvloop.run(_node(sys.argv[2]))
    except ImportError:  # pragma: no cover
        asyncio.run(_node(sys.argv[2]))


if __name__ == "__main__":
    _main()
