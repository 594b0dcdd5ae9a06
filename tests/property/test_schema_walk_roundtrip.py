"""The walker steps over exactly the bytes kio writes, for messages of every API."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.static.primitive import Records

from proxy.kafka.codec import encode, load_types
from proxy.kafka.schema_walk import skip_entity, validate
from proxy.kafka.versions import APIS

st.register_type_strategy(Records, st.binary(max_size=40).map(Records))

EVERY_MESSAGE = [
    message
    for api_key in sorted(APIS)
    for kind in ("request", "response")
    for message in load_types(api_key, kind).values()
]


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data(), message=st.sampled_from(EVERY_MESSAGE))
def test_walker_agrees_with_kio_on_every_message(data, message):
    body = encode(data.draw(st.from_type(message)))
    assert skip_entity(message, memoryview(body)) == len(body)
    validate(message, body)
