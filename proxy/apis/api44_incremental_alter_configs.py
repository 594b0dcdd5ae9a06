"""IncrementalAlterConfigs (api key 44), v0-v1: its answer has AlterConfigs' shape
(api33_alter_configs.py, which reads both), flexible from v1; a proxy that tiers topics
reads it to read a tiered topic's changed configs again (proxy/tiered/config_changes.py).
"""

from __future__ import annotations

from proxy.apis.api33_alter_configs import AlteredResource, read_altered
from proxy.kafka.api_keys import ApiKey
from proxy.kafka.codec import load_response_types

API_KEY = ApiKey.INCREMENTAL_ALTER_CONFIGS
RESPONSES = load_response_types(API_KEY)


def read_incremental_alter_configs_response(
    api_version: int, body: memoryview | bytes
) -> list[AlteredResource]:
    """Every resource's result, as `read_alter_configs_response` reads them."""
    return read_altered(RESPONSES, API_KEY, api_version, body)
