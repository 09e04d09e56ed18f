"""Stand-ins for the outside world, shared by the tests and the benchmarks: a software App Attest
attester, a gateway client, a TLS test PKI made at run time and an HTTP/2 APNs emulator that behaves
like Apple's documented API. Nothing here runs in `appliance serve`."""
