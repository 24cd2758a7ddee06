from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExplainRequest(_message.Message):
    __slots__ = ("headers", "body", "subset_hint", "has_subset_hint")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    SUBSET_HINT_FIELD_NUMBER: _ClassVar[int]
    HAS_SUBSET_HINT_FIELD_NUMBER: _ClassVar[int]
    headers: _containers.ScalarMap[str, str]
    body: bytes
    subset_hint: _containers.RepeatedScalarFieldContainer[str]
    has_subset_hint: bool
    def __init__(self, headers: _Optional[_Mapping[str, str]] = ..., body: _Optional[bytes] = ..., subset_hint: _Optional[_Iterable[str]] = ..., has_subset_hint: _Optional[bool] = ...) -> None: ...

class CandidateScore(_message.Message):
    __slots__ = ("endpoint", "id", "total", "scorers")
    class ScorersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SCORERS_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    id: str
    total: float
    scorers: _containers.ScalarMap[str, float]
    def __init__(self, endpoint: _Optional[str] = ..., id: _Optional[str] = ..., total: _Optional[float] = ..., scorers: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ProfileExplain(_message.Message):
    __slots__ = ("name", "targets", "scores")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    name: str
    targets: _containers.RepeatedScalarFieldContainer[str]
    scores: _containers.RepeatedCompositeFieldContainer[CandidateScore]
    def __init__(self, name: _Optional[str] = ..., targets: _Optional[_Iterable[str]] = ..., scores: _Optional[_Iterable[_Union[CandidateScore, _Mapping]]] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("outcome", "request_id", "path", "model", "target_model", "objective", "priority", "fairness_id", "candidates", "primary_profile", "profiles", "destination", "status", "error", "scheduling_seconds")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODEL_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    FAIRNESS_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_PROFILE_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SCHEDULING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    outcome: str
    request_id: str
    path: str
    model: str
    target_model: str
    objective: str
    priority: int
    fairness_id: str
    candidates: int
    primary_profile: str
    profiles: _containers.RepeatedCompositeFieldContainer[ProfileExplain]
    destination: str
    status: int
    error: str
    scheduling_seconds: float
    def __init__(self, outcome: _Optional[str] = ..., request_id: _Optional[str] = ..., path: _Optional[str] = ..., model: _Optional[str] = ..., target_model: _Optional[str] = ..., objective: _Optional[str] = ..., priority: _Optional[int] = ..., fairness_id: _Optional[str] = ..., candidates: _Optional[int] = ..., primary_profile: _Optional[str] = ..., profiles: _Optional[_Iterable[_Union[ProfileExplain, _Mapping]]] = ..., destination: _Optional[str] = ..., status: _Optional[int] = ..., error: _Optional[str] = ..., scheduling_seconds: _Optional[float] = ...) -> None: ...

class ListEndpointsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EndpointInfo(_message.Message):
    __slots__ = ("id", "address", "rank", "role", "labels", "scraped", "age_seconds", "waiting_queue_size", "running_requests_size", "kv_cache_usage_percent", "active_models", "waiting_models", "max_active_models", "cache_block_size", "cache_num_blocks", "custom", "attributes")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class CustomEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SCRAPED_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WAITING_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_MODELS_FIELD_NUMBER: _ClassVar[int]
    WAITING_MODELS_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVE_MODELS_FIELD_NUMBER: _ClassVar[int]
    CACHE_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    CACHE_NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    rank: int
    role: str
    labels: _containers.ScalarMap[str, str]
    scraped: bool
    age_seconds: float
    waiting_queue_size: int
    running_requests_size: int
    kv_cache_usage_percent: float
    active_models: _containers.RepeatedScalarFieldContainer[str]
    waiting_models: _containers.RepeatedScalarFieldContainer[str]
    max_active_models: int
    cache_block_size: int
    cache_num_blocks: int
    custom: _containers.ScalarMap[str, float]
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., rank: _Optional[int] = ..., role: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., scraped: _Optional[bool] = ..., age_seconds: _Optional[float] = ..., waiting_queue_size: _Optional[int] = ..., running_requests_size: _Optional[int] = ..., kv_cache_usage_percent: _Optional[float] = ..., active_models: _Optional[_Iterable[str]] = ..., waiting_models: _Optional[_Iterable[str]] = ..., max_active_models: _Optional[int] = ..., cache_block_size: _Optional[int] = ..., cache_num_blocks: _Optional[int] = ..., custom: _Optional[_Mapping[str, float]] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListEndpointsResponse(_message.Message):
    __slots__ = ("endpoints",)
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointInfo]
    def __init__(self, endpoints: _Optional[_Iterable[_Union[EndpointInfo, _Mapping]]] = ...) -> None: ...

class DumpStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PluginState(_message.Message):
    __slots__ = ("type", "name", "json")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    type: str
    name: str
    json: str
    def __init__(self, type: _Optional[str] = ..., name: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class FlowControlState(_message.Message):
    __slots__ = ("enabled", "in_flight", "queued_by_priority")
    class QueuedByPriorityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_BY_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    in_flight: int
    queued_by_priority: _containers.ScalarMap[int, int]
    def __init__(self, enabled: _Optional[bool] = ..., in_flight: _Optional[int] = ..., queued_by_priority: _Optional[_Mapping[int, int]] = ...) -> None: ...

class SharingState(_message.Message):
    __slots__ = ("enabled", "lag_seconds", "bootstrapped", "outbox_facts")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAPPED_FIELD_NUMBER: _ClassVar[int]
    OUTBOX_FACTS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    lag_seconds: float
    bootstrapped: bool
    outbox_facts: int
    def __init__(self, enabled: _Optional[bool] = ..., lag_seconds: _Optional[float] = ..., bootstrapped: _Optional[bool] = ..., outbox_facts: _Optional[int] = ...) -> None: ...

class DumpStateResponse(_message.Message):
    __slots__ = ("plugins", "flow_control", "sharing")
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    FLOW_CONTROL_FIELD_NUMBER: _ClassVar[int]
    SHARING_FIELD_NUMBER: _ClassVar[int]
    plugins: _containers.RepeatedCompositeFieldContainer[PluginState]
    flow_control: FlowControlState
    sharing: SharingState
    def __init__(self, plugins: _Optional[_Iterable[_Union[PluginState, _Mapping]]] = ..., flow_control: _Optional[_Union[FlowControlState, _Mapping]] = ..., sharing: _Optional[_Union[SharingState, _Mapping]] = ...) -> None: ...
