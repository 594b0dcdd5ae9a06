"""The proxy's own SASL client: RFC 7677's SCRAM-SHA-256 example, byte for byte."""

from __future__ import annotations

import pytest

from proxy.kafka.sasl import SaslError, ScramClient, plain_message

# RFC 7677, section 3
NONCE = "rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_scram_sha_256_matches_rfc_7677():
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=NONCE)
    assert client.first_message() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert client.final_message(SERVER_FIRST) == CLIENT_FINAL
    client.verify(SERVER_FINAL)


def test_wrong_server_signature_is_refused():
    client = ScramClient("SCRAM-SHA-256", "user", "not-pencil", nonce=NONCE)
    client.final_message(SERVER_FIRST)
    with pytest.raises(SaslError, match="does not know the password"):
        client.verify(SERVER_FINAL)


def test_server_nonce_must_extend_the_clients():
    client = ScramClient("SCRAM-SHA-512", "user", "pencil", nonce="abc")
    with pytest.raises(SaslError, match="nonce"):
        client.final_message(b"r=xyz,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")


def test_username_is_escaped_and_plain_is_nul_separated():
    client = ScramClient("SCRAM-SHA-512", "a=b,c", "pw", nonce="n")
    assert client.first_message() == b"n,,n=a=3Db=2Cc,r=n"
    assert plain_message("alice", "secret") == b"\0alice\0secret"
