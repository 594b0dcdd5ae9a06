"""SSL contexts for the client listeners and for the connections to upstream brokers."""

from __future__ import annotations

import ssl

from proxy.config import TlsConfig


def server_context(tls: TlsConfig) -> ssl.SSLContext | None:
    if not tls.enabled:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    assert tls.cert_file is not None and tls.key_file is not None  # checked by the config
    context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_auth:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=tls.ca_file)
    return context


def client_context(tls: TlsConfig) -> ssl.SSLContext | None:
    if not tls.enabled:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
    context.check_hostname = tls.check_hostname
    if tls.cert_file is not None and tls.key_file is not None:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context
