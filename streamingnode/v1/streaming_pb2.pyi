from streamingnode.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProduceRequest(_message.Message):
    __slots__ = ("open", "batch", "close")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    open: ProduceOpen
    batch: ProduceBatch
    close: ProduceClose
    def __init__(self, open: _Optional[_Union[ProduceOpen, _Mapping]] = ..., batch: _Optional[_Union[ProduceBatch, _Mapping]] = ..., close: _Optional[_Union[ProduceClose, _Mapping]] = ...) -> None: ...

class ProduceOpen(_message.Message):
    __slots__ = ("pchannel", "producer_id", "producer_epoch")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    producer_id: str
    producer_epoch: int
    def __init__(self, pchannel: _Optional[str] = ..., producer_id: _Optional[str] = ..., producer_epoch: _Optional[int] = ...) -> None: ...

class ProduceBatch(_message.Message):
    __slots__ = ("request_id", "messages", "txn", "first_sequence", "columns")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TXN_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    txn: _common_pb2.TxnContext
    first_sequence: int
    columns: _common_pb2.MessageColumns
    def __init__(self, request_id: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ..., txn: _Optional[_Union[_common_pb2.TxnContext, _Mapping]] = ..., first_sequence: _Optional[int] = ..., columns: _Optional[_Union[_common_pb2.MessageColumns, _Mapping]] = ...) -> None: ...

class ProduceClose(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("opened", "result", "closed")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    opened: ProduceOpened
    result: ProduceBatchResult
    closed: ProduceClosed
    def __init__(self, opened: _Optional[_Union[ProduceOpened, _Mapping]] = ..., result: _Optional[_Union[ProduceBatchResult, _Mapping]] = ..., closed: _Optional[_Union[ProduceClosed, _Mapping]] = ...) -> None: ...

class ProduceOpened(_message.Message):
    __slots__ = ("pchannel", "term", "producer_id", "producer_epoch", "next_sequence")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    producer_id: str
    producer_epoch: int
    next_sequence: int
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., producer_id: _Optional[str] = ..., producer_epoch: _Optional[int] = ..., next_sequence: _Optional[int] = ...) -> None: ...

class ProduceBatchResult(_message.Message):
    __slots__ = ("request_id", "appended", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    APPENDED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    appended: AppendResults
    error: _common_pb2.ErrorDetail
    def __init__(self, request_id: _Optional[int] = ..., appended: _Optional[_Union[AppendResults, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.ErrorDetail, _Mapping]] = ...) -> None: ...

class AppendResults(_message.Message):
    __slots__ = ("results", "ids", "timeticks", "txn_ids")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    TIMETICKS_FIELD_NUMBER: _ClassVar[int]
    TXN_IDS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AppendResult]
    ids: _containers.RepeatedScalarFieldContainer[int]
    timeticks: _containers.RepeatedScalarFieldContainer[int]
    txn_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, results: _Optional[_Iterable[_Union[AppendResult, _Mapping]]] = ..., ids: _Optional[_Iterable[int]] = ..., timeticks: _Optional[_Iterable[int]] = ..., txn_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AppendResult(_message.Message):
    __slots__ = ("id", "timetick", "txn_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMETICK_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    id: _common_pb2.MessageID
    timetick: int
    txn_id: int
    def __init__(self, id: _Optional[_Union[_common_pb2.MessageID, _Mapping]] = ..., timetick: _Optional[int] = ..., txn_id: _Optional[int] = ...) -> None: ...

class ProduceClosed(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("open", "ack", "close")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    open: ConsumeOpen
    ack: ConsumeAck
    close: ConsumeClose
    def __init__(self, open: _Optional[_Union[ConsumeOpen, _Mapping]] = ..., ack: _Optional[_Union[ConsumeAck, _Mapping]] = ..., close: _Optional[_Union[ConsumeClose, _Mapping]] = ...) -> None: ...

class ConsumeOpen(_message.Message):
    __slots__ = ("pchannel", "vchannel", "policy", "filters", "consumer_group", "max_pack_messages", "columns", "max_response_bytes")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_PACK_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    MAX_RESPONSE_BYTES_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    vchannel: str
    policy: _common_pb2.DeliverPolicy
    filters: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeliverFilter]
    consumer_group: str
    max_pack_messages: int
    columns: bool
    max_response_bytes: int
    def __init__(self, pchannel: _Optional[str] = ..., vchannel: _Optional[str] = ..., policy: _Optional[_Union[_common_pb2.DeliverPolicy, _Mapping]] = ..., filters: _Optional[_Iterable[_Union[_common_pb2.DeliverFilter, _Mapping]]] = ..., consumer_group: _Optional[str] = ..., max_pack_messages: _Optional[int] = ..., columns: _Optional[bool] = ..., max_response_bytes: _Optional[int] = ...) -> None: ...

class ConsumeAck(_message.Message):
    __slots__ = ("positions",)
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Position]
    def __init__(self, positions: _Optional[_Iterable[_Union[_common_pb2.Position, _Mapping]]] = ...) -> None: ...

class ConsumeClose(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConsumeResponse(_message.Message):
    __slots__ = ("opened", "pack", "acked", "closed", "error")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    PACK_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    opened: ConsumeOpened
    pack: _common_pb2.MsgPack
    acked: ConsumeAcked
    closed: ConsumeClosed
    error: _common_pb2.ErrorDetail
    def __init__(self, opened: _Optional[_Union[ConsumeOpened, _Mapping]] = ..., pack: _Optional[_Union[_common_pb2.MsgPack, _Mapping]] = ..., acked: _Optional[_Union[ConsumeAcked, _Mapping]] = ..., closed: _Optional[_Union[ConsumeClosed, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.ErrorDetail, _Mapping]] = ...) -> None: ...

class ConsumeOpened(_message.Message):
    __slots__ = ("consumer_id", "term")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    consumer_id: int
    term: int
    def __init__(self, consumer_id: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class ConsumeAcked(_message.Message):
    __slots__ = ("positions",)
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Position]
    def __init__(self, positions: _Optional[_Iterable[_Union[_common_pb2.Position, _Mapping]]] = ...) -> None: ...

class ConsumeClosed(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BeginTxnRequest(_message.Message):
    __slots__ = ("pchannel", "vchannel", "keepalive_ms")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_MS_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    vchannel: str
    keepalive_ms: int
    def __init__(self, pchannel: _Optional[str] = ..., vchannel: _Optional[str] = ..., keepalive_ms: _Optional[int] = ...) -> None: ...

class BeginTxnResponse(_message.Message):
    __slots__ = ("txn_id", "begin_timetick", "message_id", "keepalive_ms")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    BEGIN_TIMETICK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_MS_FIELD_NUMBER: _ClassVar[int]
    txn_id: int
    begin_timetick: int
    message_id: _common_pb2.MessageID
    keepalive_ms: int
    def __init__(self, txn_id: _Optional[int] = ..., begin_timetick: _Optional[int] = ..., message_id: _Optional[_Union[_common_pb2.MessageID, _Mapping]] = ..., keepalive_ms: _Optional[int] = ...) -> None: ...

class CommitTxnRequest(_message.Message):
    __slots__ = ("pchannel", "vchannel", "txn_id")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    vchannel: str
    txn_id: int
    def __init__(self, pchannel: _Optional[str] = ..., vchannel: _Optional[str] = ..., txn_id: _Optional[int] = ...) -> None: ...

class CommitTxnResponse(_message.Message):
    __slots__ = ("commit_timetick", "message_id")
    COMMIT_TIMETICK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    commit_timetick: int
    message_id: _common_pb2.MessageID
    def __init__(self, commit_timetick: _Optional[int] = ..., message_id: _Optional[_Union[_common_pb2.MessageID, _Mapping]] = ...) -> None: ...

class RollbackTxnRequest(_message.Message):
    __slots__ = ("pchannel", "vchannel", "txn_id")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    vchannel: str
    txn_id: int
    def __init__(self, pchannel: _Optional[str] = ..., vchannel: _Optional[str] = ..., txn_id: _Optional[int] = ...) -> None: ...

class RollbackTxnResponse(_message.Message):
    __slots__ = ("rollback_timetick", "message_id")
    ROLLBACK_TIMETICK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    rollback_timetick: int
    message_id: _common_pb2.MessageID
    def __init__(self, rollback_timetick: _Optional[int] = ..., message_id: _Optional[_Union[_common_pb2.MessageID, _Mapping]] = ...) -> None: ...

class CreateChannelsRequest(_message.Message):
    __slots__ = ("owner", "num_channels", "channel_names")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    NUM_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    owner: _common_pb2.OwnerDescription
    num_channels: int
    channel_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, owner: _Optional[_Union[_common_pb2.OwnerDescription, _Mapping]] = ..., num_channels: _Optional[int] = ..., channel_names: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateChannelsResponse(_message.Message):
    __slots__ = ("channel_names",)
    CHANNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    channel_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, channel_names: _Optional[_Iterable[str]] = ...) -> None: ...

class DestroyChannelsRequest(_message.Message):
    __slots__ = ("channel_names",)
    CHANNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    channel_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, channel_names: _Optional[_Iterable[str]] = ...) -> None: ...

class DestroyChannelsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeChannelsRequest(_message.Message):
    __slots__ = ("channel_names",)
    CHANNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    channel_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, channel_names: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeChannelsResponse(_message.Message):
    __slots__ = ("descriptions",)
    DESCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    descriptions: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChannelDescription]
    def __init__(self, descriptions: _Optional[_Iterable[_Union[_common_pb2.ChannelDescription, _Mapping]]] = ...) -> None: ...

class CreateConsumerGroupRequest(_message.Message):
    __slots__ = ("pchannel", "group")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    group: str
    def __init__(self, pchannel: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class CreateConsumerGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DestroyConsumerGroupRequest(_message.Message):
    __slots__ = ("pchannel", "group")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    group: str
    def __init__(self, pchannel: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class DestroyConsumerGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeConsumerGroupsRequest(_message.Message):
    __slots__ = ("pchannel", "groups")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pchannel: _Optional[str] = ..., groups: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeConsumerGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[ConsumerGroupDescription]
    def __init__(self, groups: _Optional[_Iterable[_Union[ConsumerGroupDescription, _Mapping]]] = ...) -> None: ...

class ConsumerGroupDescription(_message.Message):
    __slots__ = ("pchannel", "group", "vchannels")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    group: str
    vchannels: _containers.RepeatedCompositeFieldContainer[ConsumerGroupProgress]
    def __init__(self, pchannel: _Optional[str] = ..., group: _Optional[str] = ..., vchannels: _Optional[_Iterable[_Union[ConsumerGroupProgress, _Mapping]]] = ...) -> None: ...

class ConsumerGroupProgress(_message.Message):
    __slots__ = ("vchannel", "committed", "lag_messages", "lag_ms", "problem")
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    LAG_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    LAG_MS_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    committed: _common_pb2.Position
    lag_messages: int
    lag_ms: int
    problem: str
    def __init__(self, vchannel: _Optional[str] = ..., committed: _Optional[_Union[_common_pb2.Position, _Mapping]] = ..., lag_messages: _Optional[int] = ..., lag_ms: _Optional[int] = ..., problem: _Optional[str] = ...) -> None: ...

class SeekConsumerGroupRequest(_message.Message):
    __slots__ = ("group", "pchannel", "vchannel", "policy", "position")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    group: str
    pchannel: str
    vchannel: str
    policy: _common_pb2.DeliverPolicy
    position: _common_pb2.Position
    def __init__(self, group: _Optional[str] = ..., pchannel: _Optional[str] = ..., vchannel: _Optional[str] = ..., policy: _Optional[_Union[_common_pb2.DeliverPolicy, _Mapping]] = ..., position: _Optional[_Union[_common_pb2.Position, _Mapping]] = ...) -> None: ...

class SeekConsumerGroupResponse(_message.Message):
    __slots__ = ("position",)
    POSITION_FIELD_NUMBER: _ClassVar[int]
    position: _common_pb2.Position
    def __init__(self, position: _Optional[_Union[_common_pb2.Position, _Mapping]] = ...) -> None: ...

class GetLatestPositionRequest(_message.Message):
    __slots__ = ("pchannel", "vchannel")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    vchannel: str
    def __init__(self, pchannel: _Optional[str] = ..., vchannel: _Optional[str] = ...) -> None: ...

class GetLatestPositionResponse(_message.Message):
    __slots__ = ("last", "mvcc_timetick")
    LAST_FIELD_NUMBER: _ClassVar[int]
    MVCC_TIMETICK_FIELD_NUMBER: _ClassVar[int]
    last: _common_pb2.Position
    mvcc_timetick: int
    def __init__(self, last: _Optional[_Union[_common_pb2.Position, _Mapping]] = ..., mvcc_timetick: _Optional[int] = ...) -> None: ...

class FlushRequest(_message.Message):
    __slots__ = ("pchannel", "vchannel", "collection")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    vchannel: str
    collection: str
    def __init__(self, pchannel: _Optional[str] = ..., vchannel: _Optional[str] = ..., collection: _Optional[str] = ...) -> None: ...

class FlushResponse(_message.Message):
    __slots__ = ("files", "flush_timetick")
    FILES_FIELD_NUMBER: _ClassVar[int]
    FLUSH_TIMETICK_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedScalarFieldContainer[str]
    flush_timetick: int
    def __init__(self, files: _Optional[_Iterable[str]] = ..., flush_timetick: _Optional[int] = ...) -> None: ...

class BackupRequest(_message.Message):
    __slots__ = ("to", "pchannels", "max_bytes_per_second")
    TO_FIELD_NUMBER: _ClassVar[int]
    PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    to: str
    pchannels: _containers.RepeatedScalarFieldContainer[str]
    max_bytes_per_second: int
    def __init__(self, to: _Optional[str] = ..., pchannels: _Optional[_Iterable[str]] = ..., max_bytes_per_second: _Optional[int] = ...) -> None: ...

class BackupChannelPosition(_message.Message):
    __slots__ = ("pchannel", "first_id", "next_id", "last_timetick", "flusher_checkpoint_id")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    FIRST_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_TIMETICK_FIELD_NUMBER: _ClassVar[int]
    FLUSHER_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    first_id: int
    next_id: int
    last_timetick: int
    flusher_checkpoint_id: int
    def __init__(self, pchannel: _Optional[str] = ..., first_id: _Optional[int] = ..., next_id: _Optional[int] = ..., last_timetick: _Optional[int] = ..., flusher_checkpoint_id: _Optional[int] = ...) -> None: ...

class BackupResult(_message.Message):
    __slots__ = ("path", "positions", "files_copied", "bytes_copied", "files_reused", "bytes_reused", "seconds")
    PATH_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    FILES_COPIED_FIELD_NUMBER: _ClassVar[int]
    BYTES_COPIED_FIELD_NUMBER: _ClassVar[int]
    FILES_REUSED_FIELD_NUMBER: _ClassVar[int]
    BYTES_REUSED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    path: str
    positions: _containers.RepeatedCompositeFieldContainer[BackupChannelPosition]
    files_copied: int
    bytes_copied: int
    files_reused: int
    bytes_reused: int
    seconds: float
    def __init__(self, path: _Optional[str] = ..., positions: _Optional[_Iterable[_Union[BackupChannelPosition, _Mapping]]] = ..., files_copied: _Optional[int] = ..., bytes_copied: _Optional[int] = ..., files_reused: _Optional[int] = ..., bytes_reused: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class BackupProgress(_message.Message):
    __slots__ = ("phase", "files_done", "files_total", "bytes_done", "bytes_total", "result")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    FILES_DONE_FIELD_NUMBER: _ClassVar[int]
    FILES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    phase: str
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    result: BackupResult
    def __init__(self, phase: _Optional[str] = ..., files_done: _Optional[int] = ..., files_total: _Optional[int] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., result: _Optional[_Union[BackupResult, _Mapping]] = ...) -> None: ...
