"""The peer: Ray Serve serving the same ONNX model on the same box, over HTTP.

The deployment runs the model with the worker's own ONNX Runtime session
options (:class:`inferbus.accelerators.OnnxRuntimeBackend`) and speaks the same
body as inferbus (MessagePack OIP v2 request in, response out), so the load
generator sends the same bytes and checks the answers with the same judge.
Ray is an optional extra (``pip install -e .[peers]``): :func:`unavailable`
says why the peer cannot run, or None.
"""

from __future__ import annotations

import time


def unavailable() -> str | None:
    """None when Ray Serve can run here, else the reason (e.g. 'ray is not installed')."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"ray[serve] is not importable ({type(exc).__name__}: {exc}); install the 'peers' extra"
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return "aiohttp (the HTTP load generator's client) is not installed"
    return None


def _deployment():
    from ray import serve

    @serve.deployment(max_ongoing_requests=256)
    class OnnxModel:
        def __init__(self, path: str, name: str, version: str) -> None:
            from inferbus.accelerators import OnnxRuntimeBackend

            self.sess = OnnxRuntimeBackend().load(path)
            self.name, self.version = name, version

        async def __call__(self, request):
            from starlette.responses import Response

            from inferbus.schemas import (
                InferResponse, decode_request, encode_response, input_to_numpy, output_from_numpy,
            )

            req = decode_request(await request.body())
            feeds = {t.name: input_to_numpy(t, field=f"inputs[{i}]") for i, t in enumerate(req.inputs)}
            out = self.sess.infer(feeds)
            resp = InferResponse(model_name=self.name, model_version=self.version, id=req.id,
                                 outputs=[output_from_numpy(k, v, raw=True) for k, v in out.items()],
                                 parameters={"backend": "ray-serve"})
            return Response(encode_response(resp), media_type="application/msgpack")

    return OnnxModel


class RayPeer:
    """Ray (local, ``num_cpus``) + Serve on ``127.0.0.1:port``, ``replicas`` replicas of the model.

    ``start()`` and ``stop()`` block (seconds to tens of seconds); call them from a thread.
    ``url`` is where to POST requests.
    """

    def __init__(self, model_path: str, model: str, version: str, *, replicas: int = 1, port: int = 0,
                 num_cpus: int | None = None) -> None:
        from inferbus.bus import free_port

        self.model_path, self.model, self.version = model_path, model, version
        self.replicas = replicas
        self.port = port or free_port()
        self.num_cpus = num_cpus
        self.start_s = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.model}"

    def start(self) -> None:
        import ray
        from ray import serve

        t0 = time.monotonic()
        ray.init(num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 ignore_reinit_error=True)
        serve.start(http_options={"host": "127.0.0.1", "port": self.port})
        app = _deployment().options(num_replicas=self.replicas, ray_actor_options={"num_cpus": 0}).bind(
            self.model_path, self.model, self.version)
        serve.run(app, name=self.model, route_prefix=f"/{self.model}", blocking=False)
        self._wait_http(120.0)
        self.start_s = time.monotonic() - t0

    def _wait_http(self, timeout_s: float) -> None:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(urllib.request.Request(self.url, data=b"", method="POST"), timeout=2)
                return
            except urllib.error.HTTPError:
                return  # the route answers (an empty body is an error reply, but the app is up)
            except Exception:
                time.sleep(0.25)
        raise TimeoutError(f"Ray Serve not answering on {self.url} after {timeout_s}s")

    def stop(self) -> None:
        import ray
        from ray import serve

        try:
            serve.shutdown()
        finally:
            ray.shutdown()
