"""A gateway client as the iOS app drives it: challenge, enroll, delegate, rotate, revoke.

Each call fetches a fresh challenge, builds the route's exact transcript (`appliance.gateway.
transcript`), has the software attester attest or assert over it and POSTs the closed object.
Used by the end-to-end tests and `appliance bench gateway`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from appliance.gateway import transcript as tr

from .attester import SoftwareAttester


@dataclass
class AppInstallation:
    """One app install talking to a gateway whose public base URL is `public_url`."""

    http: httpx.AsyncClient  # its base_url is where the gateway listens
    public_url: str
    attester: SoftwareAttester
    app_profile: str
    endpoint: str  # the APNs token, lowercase hex
    handle: str | None = None
    epoch: int = 1
    expires_at: int = 0
    grants: dict[str, str] = field(default_factory=dict)  # relay pubkey -> latest grant

    @property
    def path_prefix(self) -> str:
        from urllib.parse import urlsplit

        return urlsplit(self.public_url).path.rstrip("/")

    async def post(self, route: str, body: dict[str, Any] | bytes, **headers: str) -> httpx.Response:
        content = body if isinstance(body, bytes) else _compact(body)
        return await self.http.post(self.path_prefix + route, content=content,
                                    headers={"content-type": "application/json", **headers})

    async def challenge(self) -> dict[str, Any]:
        r = await self.post("/v1/installations/challenges", {"v": 1})
        r.raise_for_status()
        return r.json()

    async def enroll(self, *, lifetime: int = 86400, expires_at: int | None = None,
                     tamper: dict[str, Any] | None = None) -> httpx.Response:
        c = await self.challenge()
        self.expires_at = expires_at if expires_at is not None else int(time.time()) + lifetime
        req = {"v": 1, "challenge_id": c["challenge_id"], "challenge": c["challenge"],
               "key_id": self.attester.key_id_b64, "app_profile": self.app_profile, "endpoint": self.endpoint,
               "endpoint_epoch": 1, "expires_at": self.expires_at}
        req["attestation"] = self.attester.attest(tr.transcript(tr.ENROLL, self.public_url, req))
        req.update(tamper or {})
        r = await self.post("/v1/installations", req)
        if r.status_code == 201:
            self.handle = r.json()["installation_handle"]
            self.epoch = 1
        return r

    async def _asserted(self, route: str, domain: str, fields: dict[str, Any],
                        tamper: dict[str, Any] | None = None, counter: int | None = None) -> httpx.Response:
        c = await self.challenge()
        req = {"v": 1, "challenge_id": c["challenge_id"], "challenge": c["challenge"],
               "installation_handle": self.handle, **fields}
        req["assertion"] = self.attester.assert_(tr.transcript(domain, self.public_url, req), counter=counter)
        req.update(tamper or {})
        return await self.post(route, req)

    async def delegate(self, relay_pubkey: str, generation: int, *, lifetime: int = 3600,
                       not_before: int | None = None, expires_at: int | None = None,
                       epoch: int | None = None, **kw) -> httpx.Response:
        now = int(time.time())
        fields = {"endpoint_epoch": self.epoch if epoch is None else epoch, "generation": generation,
                  "relay_pubkey": relay_pubkey, "not_before": now - 60 if not_before is None else not_before,
                  "expires_at": now + lifetime if expires_at is None else expires_at}
        r = await self._asserted("/v1/delegations", tr.DELEGATE, fields, **kw)
        if r.status_code == 201:
            self.grants[relay_pubkey] = r.json()["endpoint_grant"]
        return r

    async def rotate(self, new_endpoint: str, **kw) -> httpx.Response:
        fields = {"endpoint_epoch": self.epoch, "new_endpoint_epoch": self.epoch + 1, "endpoint": new_endpoint}
        r = await self._asserted("/v1/installations/endpoint", tr.ROTATE_ENDPOINT, fields, **kw)
        if r.status_code == 200:
            self.epoch += 1
            self.endpoint = new_endpoint
        return r

    async def revoke_delegation(self, relay_pubkey: str, generation: int, **kw) -> httpx.Response:
        fields = {"relay_pubkey": relay_pubkey, "generation": generation}
        return await self._asserted("/v1/delegations/revoke", tr.REVOKE_DELEGATION, fields, **kw)

    async def revoke(self, *, epoch: int | None = None, **kw) -> httpx.Response:
        e = self.epoch if epoch is None else epoch
        fields = {"endpoint_epoch": e, "new_endpoint_epoch": e + 1}
        r = await self._asserted("/v1/installations/revoke", tr.REVOKE_INSTALLATION, fields, **kw)
        if r.status_code == 200 and epoch is None:
            self.epoch += 1
        return r


def _compact(obj: dict[str, Any]) -> bytes:
    import json

    return json.dumps(obj, separators=(",", ":")).encode()
