"""DeleteRecords on a tiered partition is checked before anything is deleted, as Kafka
checks it (proxy/tiered/deletes.py): an offset past the high watermark, or
negative and not -1, deletes neither Kafka's part nor the stream's. Its answer combines
Kafka's part's and the trim's."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from proxy.apis.api21_delete_records import DeleteResult
from proxy.tiered.deletes import combined, needs_high_watermark, policy_refusal, refusal
from proxy.upkeep.retention_plan import RetentionConfig

OFFSET_OUT_OF_RANGE, NOT_LEADER_OR_FOLLOWER = 1, 6
CUTOVER = 3


def test_offsets_up_to_the_cutover_need_no_high_watermark():
    assert not needs_high_watermark(-1, CUTOVER)
    assert not needs_high_watermark(0, CUTOVER)
    assert not needs_high_watermark(CUTOVER, CUTOVER)
    assert needs_high_watermark(CUTOVER + 1, CUTOVER)
    assert refusal(-1, CUTOVER, None) is None  # the high watermark: always in range
    assert refusal(2, CUTOVER, None) is None  # owner away: Kafka's part alone is enough


def test_past_the_high_watermark_is_out_of_range_before_anything_goes():
    assert refusal(9, CUTOVER, 6) == OFFSET_OUT_OF_RANGE  # 3 records, tier, 3 more, delete 9
    assert refusal(2, 1, 1) == OFFSET_OUT_OF_RANGE  # one record, cutover at 1, delete 2
    assert refusal(6, CUTOVER, 6) is None  # up to the high watermark itself
    assert refusal(-2, CUTOVER, 6) == OFFSET_OUT_OF_RANGE  # negative, not -1


def test_no_owner_answering_is_not_leader_and_the_client_retries():
    assert refusal(5, CUTOVER, None) == NOT_LEADER_OR_FOLLOWER


def test_the_answer_is_kafkas_error_else_the_trims_else_the_larger_low_watermark():
    ok = DeleteResult(0, 2)
    assert combined(DeleteResult(NOT_LEADER_OR_FOLLOWER), ok).error_code == NOT_LEADER_OR_FOLLOWER
    assert combined(ok, DeleteResult(OFFSET_OUT_OF_RANGE)).error_code == OFFSET_OUT_OF_RANGE
    assert combined(None, DeleteResult(0, 1)) == DeleteResult(0, 1)  # refused, or no part
    assert combined(DeleteResult(0, 1), DeleteResult(0, 7)) == DeleteResult(0, 7)  # past C
    # Kafka's own log start was past the offset already: Kafka answers it, so does the proxy
    assert combined(DeleteResult(0, 2), DeleteResult(0, 1)) == DeleteResult(0, 2)


def test_a_compacted_topic_refuses_and_configs_not_read_are_not_guessed():
    assert policy_refusal(RetentionConfig()) is None
    assert policy_refusal(RetentionConfig(delete=False)) == ErrorCode.policy_violation
    assert policy_refusal(None) == ErrorCode.kafka_storage_error  # retriable; was allowed
