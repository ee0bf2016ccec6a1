"""The fencing term as ingresses and workers know it (DESIGN §8).

Each :class:`Fencing` listens to the region managers' heartbeats
(``<p>._region.hb.*``) and keeps the highest term announced by a *primary*, or by a standby that names the lease's
holder (the term it knows is that holder's: a region cut off from the primary, whose own manager had learnt the
new term from the lease, answered under the old one until the cut healed, a fresh-user trial). The
ingress stamps it on every forwarded request (header ``Inferbus-Term``); a
worker refuses a request stamped with a lower term than the one it knows with
UNAVAILABLE (the SDK retries with the same request id; by then the ingress has
heard the new term too), and stamps the request's term on its reply
(``parameters.term``). Without region managers the term stays 0: nothing is
stamped and nothing is refused.
"""

from __future__ import annotations

from ..bus import Subjects
from ..bus import headers as H
from ..schemas import Unavailable
from ..schemas._region import PRIMARY, RegionDecodeError, RegionHeartbeat, decode_region


class Fencing:
    """The current fencing term, learnt from the region managers' heartbeats (monotonic: it never goes down).

    Runs on the actor's event loop; :meth:`stamp` and :meth:`refusal` are cheap enough for the hot path.
    """

    def __init__(self, subjects: Subjects) -> None:
        self.subjects = subjects
        self.term = 0
        """Highest term a primary region manager announced (0 = none heard)."""
        self.primary = ""
        """Region that announced :attr:`term`."""
        self._term_str = ""
        self.refused = 0
        """Requests refused because they carried an older term."""

    async def start(self, nc) -> None:
        """Subscribe to the heartbeats on ``nc`` (call before announcing readiness)."""
        await nc.subscribe(self.subjects.region_heartbeats, cb=self._on_heartbeat)

    async def _on_heartbeat(self, msg) -> None:
        try:
            hb = decode_region(msg.data)
        except RegionDecodeError:
            return
        if not isinstance(hb, RegionHeartbeat) or hb.term <= self.term:
            return
        if hb.role == PRIMARY:
            primary = hb.region
        elif hb.lease_holder and hb.lease_holder != hb.region:
            # a standby's term is the highest it knows (the lease's, or a primary's heartbeat): with a holder named,
            # another region reigns under it, which this region's actors may not hear (a partition between regions,
            # while this region still reaches the lease)
            primary = hb.lease_holder
        else:  # a vacant lease (released by a demotion) names no reign
            return
        self.term = hb.term
        self.primary = primary
        self._term_str = str(hb.term)

    def stamp(self, headers: dict) -> None:
        """Add ``Inferbus-Term`` to a forwarded request's headers (nothing while no term is known)."""
        if self._term_str:
            headers[H.TERM] = self._term_str

    def refusal(self, headers: dict) -> Unavailable | None:
        """The error to answer a request stamped with an older term with, or None to serve it.

        A request without the header (or with a malformed one) is served: it comes from a
        deployment without region managers.
        """
        raw = headers.get(H.TERM)
        if raw is None or not self.term:
            return None
        try:
            term = int(raw)
        except ValueError:
            return None
        return self.refusal_term(term)

    def refusal_term(self, term: int | None) -> Unavailable | None:
        """:meth:`refusal` for a term already parsed (None: the request carries none, it is served)."""
        if term is None or not self.term or term >= self.term:
            return None
        self.refused += 1
        return Unavailable(f"fenced: request stamped with term {term}, region {self.primary} is primary under "
                           f"term {self.term}; retry", retry_after_ms=5)
