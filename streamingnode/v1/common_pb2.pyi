from google.protobuf import empty_pb2 as _empty_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNKNOWN: _ClassVar[ErrorCode]
    ERROR_CODE_CHANNEL_NOT_EXIST: _ClassVar[ErrorCode]
    ERROR_CODE_CHANNEL_EXIST: _ClassVar[ErrorCode]
    ERROR_CODE_CHANNEL_FENCED: _ClassVar[ErrorCode]
    ERROR_CODE_ON_SHUTDOWN: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ARGUMENT: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_MESSAGE: _ClassVar[ErrorCode]
    ERROR_CODE_MESSAGE_TOO_LARGE: _ClassVar[ErrorCode]
    ERROR_CODE_OUT_OF_RANGE: _ClassVar[ErrorCode]
    ERROR_CODE_CORRUPTED: _ClassVar[ErrorCode]
    ERROR_CODE_UNRECOVERABLE: _ClassVar[ErrorCode]
    ERROR_CODE_UNAVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_RESOURCE_EXHAUSTED: _ClassVar[ErrorCode]
    ERROR_CODE_TXN_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_TXN_EXPIRED: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_TXN_STATE: _ClassVar[ErrorCode]
    ERROR_CODE_COLLECTION_NOT_EXIST: _ClassVar[ErrorCode]
    ERROR_CODE_COLLECTION_EXIST: _ClassVar[ErrorCode]
    ERROR_CODE_PARTITION_NOT_EXIST: _ClassVar[ErrorCode]
    ERROR_CODE_PARTITION_EXIST: _ClassVar[ErrorCode]
    ERROR_CODE_SCHEMA_MISMATCH: _ClassVar[ErrorCode]
    ERROR_CODE_CONSUMER_GROUP_NOT_EXIST: _ClassVar[ErrorCode]
    ERROR_CODE_CONSUMER_GROUP_EXIST: _ClassVar[ErrorCode]
    ERROR_CODE_DEADLINE_EXCEEDED: _ClassVar[ErrorCode]
    ERROR_CODE_REDO: _ClassVar[ErrorCode]
    ERROR_CODE_UNAUTHENTICATED: _ClassVar[ErrorCode]
    ERROR_CODE_PERMISSION_DENIED: _ClassVar[ErrorCode]
    ERROR_CODE_TXN_TOO_LARGE: _ClassVar[ErrorCode]
    ERROR_CODE_OUT_OF_ORDER_SEQUENCE: _ClassVar[ErrorCode]
    ERROR_CODE_STORAGE_FULL: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_OWNER: _ClassVar[ErrorCode]
    ERROR_CODE_PRODUCER_FENCED: _ClassVar[ErrorCode]
    ERROR_CODE_DUPLICATE_SEQUENCE_MISMATCH: _ClassVar[ErrorCode]

class MessageType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MESSAGE_TYPE_UNDEFINED: _ClassVar[MessageType]
    MESSAGE_TYPE_CREATE_COLLECTION: _ClassVar[MessageType]
    MESSAGE_TYPE_DROP_COLLECTION: _ClassVar[MessageType]
    MESSAGE_TYPE_CREATE_PARTITION: _ClassVar[MessageType]
    MESSAGE_TYPE_DROP_PARTITION: _ClassVar[MessageType]
    MESSAGE_TYPE_INSERT: _ClassVar[MessageType]
    MESSAGE_TYPE_DELETE: _ClassVar[MessageType]
    MESSAGE_TYPE_FLUSH: _ClassVar[MessageType]
    MESSAGE_TYPE_MANUAL_FLUSH: _ClassVar[MessageType]
    MESSAGE_TYPE_CREATE_SEGMENT: _ClassVar[MessageType]
    MESSAGE_TYPE_UPSERT: _ClassVar[MessageType]
    MESSAGE_TYPE_DATA: _ClassVar[MessageType]
    MESSAGE_TYPE_TIME_TICK: _ClassVar[MessageType]
    MESSAGE_TYPE_BEGIN_TXN: _ClassVar[MessageType]
    MESSAGE_TYPE_COMMIT_TXN: _ClassVar[MessageType]
    MESSAGE_TYPE_ROLLBACK_TXN: _ClassVar[MessageType]

class ChannelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHANNEL_STATE_UNSPECIFIED: _ClassVar[ChannelState]
    CHANNEL_STATE_SERVING: _ClassVar[ChannelState]
    CHANNEL_STATE_FAILED: _ClassVar[ChannelState]
ERROR_CODE_UNKNOWN: ErrorCode
ERROR_CODE_CHANNEL_NOT_EXIST: ErrorCode
ERROR_CODE_CHANNEL_EXIST: ErrorCode
ERROR_CODE_CHANNEL_FENCED: ErrorCode
ERROR_CODE_ON_SHUTDOWN: ErrorCode
ERROR_CODE_INVALID_ARGUMENT: ErrorCode
ERROR_CODE_INVALID_MESSAGE: ErrorCode
ERROR_CODE_MESSAGE_TOO_LARGE: ErrorCode
ERROR_CODE_OUT_OF_RANGE: ErrorCode
ERROR_CODE_CORRUPTED: ErrorCode
ERROR_CODE_UNRECOVERABLE: ErrorCode
ERROR_CODE_UNAVAILABLE: ErrorCode
ERROR_CODE_RESOURCE_EXHAUSTED: ErrorCode
ERROR_CODE_TXN_NOT_FOUND: ErrorCode
ERROR_CODE_TXN_EXPIRED: ErrorCode
ERROR_CODE_INVALID_TXN_STATE: ErrorCode
ERROR_CODE_COLLECTION_NOT_EXIST: ErrorCode
ERROR_CODE_COLLECTION_EXIST: ErrorCode
ERROR_CODE_PARTITION_NOT_EXIST: ErrorCode
ERROR_CODE_PARTITION_EXIST: ErrorCode
ERROR_CODE_SCHEMA_MISMATCH: ErrorCode
ERROR_CODE_CONSUMER_GROUP_NOT_EXIST: ErrorCode
ERROR_CODE_CONSUMER_GROUP_EXIST: ErrorCode
ERROR_CODE_DEADLINE_EXCEEDED: ErrorCode
ERROR_CODE_REDO: ErrorCode
ERROR_CODE_UNAUTHENTICATED: ErrorCode
ERROR_CODE_PERMISSION_DENIED: ErrorCode
ERROR_CODE_TXN_TOO_LARGE: ErrorCode
ERROR_CODE_OUT_OF_ORDER_SEQUENCE: ErrorCode
ERROR_CODE_STORAGE_FULL: ErrorCode
ERROR_CODE_NOT_OWNER: ErrorCode
ERROR_CODE_PRODUCER_FENCED: ErrorCode
ERROR_CODE_DUPLICATE_SEQUENCE_MISMATCH: ErrorCode
MESSAGE_TYPE_UNDEFINED: MessageType
MESSAGE_TYPE_CREATE_COLLECTION: MessageType
MESSAGE_TYPE_DROP_COLLECTION: MessageType
MESSAGE_TYPE_CREATE_PARTITION: MessageType
MESSAGE_TYPE_DROP_PARTITION: MessageType
MESSAGE_TYPE_INSERT: MessageType
MESSAGE_TYPE_DELETE: MessageType
MESSAGE_TYPE_FLUSH: MessageType
MESSAGE_TYPE_MANUAL_FLUSH: MessageType
MESSAGE_TYPE_CREATE_SEGMENT: MessageType
MESSAGE_TYPE_UPSERT: MessageType
MESSAGE_TYPE_DATA: MessageType
MESSAGE_TYPE_TIME_TICK: MessageType
MESSAGE_TYPE_BEGIN_TXN: MessageType
MESSAGE_TYPE_COMMIT_TXN: MessageType
MESSAGE_TYPE_ROLLBACK_TXN: MessageType
CHANNEL_STATE_UNSPECIFIED: ChannelState
CHANNEL_STATE_SERVING: ChannelState
CHANNEL_STATE_FAILED: ChannelState

class MessageID(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    def __init__(self, id: _Optional[bytes] = ...) -> None: ...

class TxnContext(_message.Message):
    __slots__ = ("txn_id", "keepalive_ms")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_MS_FIELD_NUMBER: _ClassVar[int]
    txn_id: int
    keepalive_ms: int
    def __init__(self, txn_id: _Optional[int] = ..., keepalive_ms: _Optional[int] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("id", "type", "vchannel", "timetick", "wal_term", "last_confirmed", "txn", "properties", "payload")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TIMETICK_FIELD_NUMBER: _ClassVar[int]
    WAL_TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    TXN_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    id: MessageID
    type: MessageType
    vchannel: str
    timetick: int
    wal_term: int
    last_confirmed: MessageID
    txn: TxnContext
    properties: _containers.ScalarMap[str, str]
    payload: bytes
    def __init__(self, id: _Optional[_Union[MessageID, _Mapping]] = ..., type: _Optional[_Union[MessageType, str]] = ..., vchannel: _Optional[str] = ..., timetick: _Optional[int] = ..., wal_term: _Optional[int] = ..., last_confirmed: _Optional[_Union[MessageID, _Mapping]] = ..., txn: _Optional[_Union[TxnContext, _Mapping]] = ..., properties: _Optional[_Mapping[str, str]] = ..., payload: _Optional[bytes] = ...) -> None: ...

class MessageColumns(_message.Message):
    __slots__ = ("types", "vchannels", "timeticks", "wal_terms", "ids", "payloads", "extras", "last_confirmeds")
    TYPES_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    TIMETICKS_FIELD_NUMBER: _ClassVar[int]
    WAL_TERMS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    EXTRAS_FIELD_NUMBER: _ClassVar[int]
    LAST_CONFIRMEDS_FIELD_NUMBER: _ClassVar[int]
    types: _containers.RepeatedScalarFieldContainer[MessageType]
    vchannels: _containers.RepeatedScalarFieldContainer[str]
    timeticks: _containers.RepeatedScalarFieldContainer[int]
    wal_terms: _containers.RepeatedScalarFieldContainer[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    payloads: _containers.RepeatedScalarFieldContainer[bytes]
    extras: _containers.RepeatedCompositeFieldContainer[MessageExtras]
    last_confirmeds: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, types: _Optional[_Iterable[_Union[MessageType, str]]] = ..., vchannels: _Optional[_Iterable[str]] = ..., timeticks: _Optional[_Iterable[int]] = ..., wal_terms: _Optional[_Iterable[int]] = ..., ids: _Optional[_Iterable[int]] = ..., payloads: _Optional[_Iterable[bytes]] = ..., extras: _Optional[_Iterable[_Union[MessageExtras, _Mapping]]] = ..., last_confirmeds: _Optional[_Iterable[int]] = ...) -> None: ...

class MessageExtras(_message.Message):
    __slots__ = ("index", "last_confirmed", "txn", "properties", "no_id")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    TXN_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    NO_ID_FIELD_NUMBER: _ClassVar[int]
    index: int
    last_confirmed: MessageID
    txn: TxnContext
    properties: _containers.ScalarMap[str, str]
    no_id: bool
    def __init__(self, index: _Optional[int] = ..., last_confirmed: _Optional[_Union[MessageID, _Mapping]] = ..., txn: _Optional[_Union[TxnContext, _Mapping]] = ..., properties: _Optional[_Mapping[str, str]] = ..., no_id: _Optional[bool] = ...) -> None: ...

class Position(_message.Message):
    __slots__ = ("pchannel", "message_id", "timetick", "vchannel")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMETICK_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    message_id: MessageID
    timetick: int
    vchannel: str
    def __init__(self, pchannel: _Optional[str] = ..., message_id: _Optional[_Union[MessageID, _Mapping]] = ..., timetick: _Optional[int] = ..., vchannel: _Optional[str] = ...) -> None: ...

class MsgPack(_message.Message):
    __slots__ = ("begin_ts", "end_ts", "messages", "start_positions", "end_positions", "columns", "continued")
    BEGIN_TS_FIELD_NUMBER: _ClassVar[int]
    END_TS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    START_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    END_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    CONTINUED_FIELD_NUMBER: _ClassVar[int]
    begin_ts: int
    end_ts: int
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    start_positions: _containers.RepeatedCompositeFieldContainer[Position]
    end_positions: _containers.RepeatedCompositeFieldContainer[Position]
    columns: MessageColumns
    continued: bool
    def __init__(self, begin_ts: _Optional[int] = ..., end_ts: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., start_positions: _Optional[_Iterable[_Union[Position, _Mapping]]] = ..., end_positions: _Optional[_Iterable[_Union[Position, _Mapping]]] = ..., columns: _Optional[_Union[MessageColumns, _Mapping]] = ..., continued: _Optional[bool] = ...) -> None: ...

class DeliverPolicy(_message.Message):
    __slots__ = ("all", "latest", "start_from", "start_after", "start_at_time")
    ALL_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    START_FROM_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    START_AT_TIME_FIELD_NUMBER: _ClassVar[int]
    all: _empty_pb2.Empty
    latest: _empty_pb2.Empty
    start_from: MessageID
    start_after: MessageID
    start_at_time: int
    def __init__(self, all: _Optional[_Union[_empty_pb2.Empty, _Mapping]] = ..., latest: _Optional[_Union[_empty_pb2.Empty, _Mapping]] = ..., start_from: _Optional[_Union[MessageID, _Mapping]] = ..., start_after: _Optional[_Union[MessageID, _Mapping]] = ..., start_at_time: _Optional[int] = ...) -> None: ...

class DeliverFilter(_message.Message):
    __slots__ = ("timetick_gt", "timetick_gte", "message_types")
    TIMETICK_GT_FIELD_NUMBER: _ClassVar[int]
    TIMETICK_GTE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPES_FIELD_NUMBER: _ClassVar[int]
    timetick_gt: int
    timetick_gte: int
    message_types: MessageTypeSet
    def __init__(self, timetick_gt: _Optional[int] = ..., timetick_gte: _Optional[int] = ..., message_types: _Optional[_Union[MessageTypeSet, _Mapping]] = ...) -> None: ...

class MessageTypeSet(_message.Message):
    __slots__ = ("types",)
    TYPES_FIELD_NUMBER: _ClassVar[int]
    types: _containers.RepeatedScalarFieldContainer[MessageType]
    def __init__(self, types: _Optional[_Iterable[_Union[MessageType, str]]] = ...) -> None: ...

class OwnerDescription(_message.Message):
    __slots__ = ("role", "address", "description_text")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_TEXT_FIELD_NUMBER: _ClassVar[int]
    role: str
    address: str
    description_text: str
    def __init__(self, role: _Optional[str] = ..., address: _Optional[str] = ..., description_text: _Optional[str] = ...) -> None: ...

class ChannelDescription(_message.Message):
    __slots__ = ("channel_name", "owner", "term", "first_id", "last_id", "last_timetick", "state", "failure", "failure_code", "problems")
    CHANNEL_NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    FIRST_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_TIMETICK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CODE_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    channel_name: str
    owner: OwnerDescription
    term: int
    first_id: MessageID
    last_id: MessageID
    last_timetick: int
    state: ChannelState
    failure: str
    failure_code: ErrorCode
    problems: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, channel_name: _Optional[str] = ..., owner: _Optional[_Union[OwnerDescription, _Mapping]] = ..., term: _Optional[int] = ..., first_id: _Optional[_Union[MessageID, _Mapping]] = ..., last_id: _Optional[_Union[MessageID, _Mapping]] = ..., last_timetick: _Optional[int] = ..., state: _Optional[_Union[ChannelState, str]] = ..., failure: _Optional[str] = ..., failure_code: _Optional[_Union[ErrorCode, str]] = ..., problems: _Optional[_Iterable[str]] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("code", "message", "metadata", "retriable")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    RETRIABLE_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    metadata: _containers.ScalarMap[str, str]
    retriable: bool
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., retriable: _Optional[bool] = ...) -> None: ...
