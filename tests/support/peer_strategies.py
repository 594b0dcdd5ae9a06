"""Hypothesis strategies for the peer protocol's fields, shared by its round-trip property
tests (tests/property/test_peer_codec_roundtrip.py, test_peer_reference_roundtrip.py)."""

from __future__ import annotations

from hypothesis import strategies as st

U32 = st.integers(min_value=0, max_value=(1 << 32) - 1)
U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
I16 = st.integers(min_value=-(1 << 15), max_value=(1 << 15) - 1)
I32 = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)
I64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
NON_NEGATIVE_I32 = st.integers(min_value=0, max_value=(1 << 31) - 1)
TEXT = st.text(max_size=40)
