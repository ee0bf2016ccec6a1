"""The SDK's connection errors are typed: Client.connect to nothing and a request on a closed connection
raise inferbus's Unavailable (not nats-py's errors), against a real nats-server / a real closed port."""

from __future__ import annotations

import asyncio

import pytest
from nats.errors import ConnectionClosedError, NoServersError

from inferbus.bus import free_port
from inferbus.client import Client
from inferbus.schemas import Unavailable

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def test_connect_to_nothing_raises_unavailable_naming_the_url_with_the_cause_chained():
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(Unavailable) as ei:
        await Client.connect(url, connect_attempts=1, connect_timeout_s=2.0)
    err = ei.value
    assert err.message.startswith(f"cannot reach NATS at {url}: "), err.message
    assert "Errno 111" in err.message, err.message  # the last connect error (ECONNREFUSED), not just "no servers"
    assert isinstance(err.__cause__, NoServersError)


async def test_request_on_a_closed_client_raises_unavailable_at_once(nats_server):
    client = await Client.connect(nats_server.url)
    await client.close()
    for _ in range(100):  # drain closes the connection shortly after it returns
        if client.nc.is_closed:
            break
        await asyncio.sleep(0.01)
    assert client.nc.is_closed
    with pytest.raises(Unavailable) as ei:
        await client.health(timeout_s=5.0)
    assert "closed" in ei.value.message
    assert isinstance(ei.value.__cause__, ConnectionClosedError)  # raised as is, not retried into a deadline
