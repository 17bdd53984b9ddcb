from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentMessage(_message.Message):
    __slots__ = ("hello", "batch", "heartbeat")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    batch: Batch
    heartbeat: Heartbeat
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("sent_ns",)
    SENT_NS_FIELD_NUMBER: _ClassVar[int]
    sent_ns: int
    def __init__(self, sent_ns: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("agent_id", "node", "version", "jobs", "capabilities", "spool_epoch", "series")
    class CapabilitiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    SPOOL_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    node: str
    version: str
    jobs: _containers.RepeatedScalarFieldContainer[str]
    capabilities: _containers.ScalarMap[str, str]
    spool_epoch: str
    series: _containers.RepeatedCompositeFieldContainer[SeriesDef]
    def __init__(self, agent_id: _Optional[str] = ..., node: _Optional[str] = ..., version: _Optional[str] = ..., jobs: _Optional[_Iterable[str]] = ..., capabilities: _Optional[_Mapping[str, str]] = ..., spool_epoch: _Optional[str] = ..., series: _Optional[_Iterable[_Union[SeriesDef, _Mapping]]] = ...) -> None: ...

class SeriesDef(_message.Message):
    __slots__ = ("id", "name", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("agent_id", "seq", "created_ns", "series", "series_ids", "timestamps_ns", "values", "steps", "events", "job_info_json", "dropped_batches", "dropped_samples", "collectives", "rank_lists", "series_ids_le", "timestamps_ns_le", "values_le")
    class JobInfoJsonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CREATED_NS_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    SERIES_IDS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_NS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    JOB_INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    RANK_LISTS_FIELD_NUMBER: _ClassVar[int]
    SERIES_IDS_LE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_NS_LE_FIELD_NUMBER: _ClassVar[int]
    VALUES_LE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    seq: int
    created_ns: int
    series: _containers.RepeatedCompositeFieldContainer[SeriesDef]
    series_ids: _containers.RepeatedScalarFieldContainer[int]
    timestamps_ns: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    steps: _containers.RepeatedCompositeFieldContainer[StepRecord]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    job_info_json: _containers.ScalarMap[str, str]
    dropped_batches: int
    dropped_samples: int
    collectives: _containers.RepeatedCompositeFieldContainer[CollectiveRecord]
    rank_lists: _containers.RepeatedCompositeFieldContainer[RankList]
    series_ids_le: bytes
    timestamps_ns_le: bytes
    values_le: bytes
    def __init__(self, agent_id: _Optional[str] = ..., seq: _Optional[int] = ..., created_ns: _Optional[int] = ..., series: _Optional[_Iterable[_Union[SeriesDef, _Mapping]]] = ..., series_ids: _Optional[_Iterable[int]] = ..., timestamps_ns: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ..., steps: _Optional[_Iterable[_Union[StepRecord, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., job_info_json: _Optional[_Mapping[str, str]] = ..., dropped_batches: _Optional[int] = ..., dropped_samples: _Optional[int] = ..., collectives: _Optional[_Iterable[_Union[CollectiveRecord, _Mapping]]] = ..., rank_lists: _Optional[_Iterable[_Union[RankList, _Mapping]]] = ..., series_ids_le: _Optional[bytes] = ..., timestamps_ns_le: _Optional[bytes] = ..., values_le: _Optional[bytes] = ...) -> None: ...

class RankList(_message.Message):
    __slots__ = ("ranks",)
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class CollectiveRecord(_message.Message):
    __slots__ = ("job", "source", "op", "rank", "raw_op", "pg_id", "pg_name", "pg_desc", "comm_id", "pg_ranks_index", "group_rank", "group_size", "nnodes", "collective_seq_id", "p2p_seq_id", "is_p2p", "peer", "bytes", "dtype", "state", "time_created_ns", "time_completed_ns", "duration_ms", "algbw_gbs", "busbw_gbs", "timing_source", "host", "pid", "provenance")
    JOB_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    RAW_OP_FIELD_NUMBER: _ClassVar[int]
    PG_ID_FIELD_NUMBER: _ClassVar[int]
    PG_NAME_FIELD_NUMBER: _ClassVar[int]
    PG_DESC_FIELD_NUMBER: _ClassVar[int]
    COMM_ID_FIELD_NUMBER: _ClassVar[int]
    PG_RANKS_INDEX_FIELD_NUMBER: _ClassVar[int]
    GROUP_RANK_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    NNODES_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    P2P_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    IS_P2P_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TIME_CREATED_NS_FIELD_NUMBER: _ClassVar[int]
    TIME_COMPLETED_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    ALGBW_GBS_FIELD_NUMBER: _ClassVar[int]
    BUSBW_GBS_FIELD_NUMBER: _ClassVar[int]
    TIMING_SOURCE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    job: str
    source: str
    op: str
    rank: int
    raw_op: str
    pg_id: int
    pg_name: str
    pg_desc: str
    comm_id: str
    pg_ranks_index: int
    group_rank: int
    group_size: int
    nnodes: int
    collective_seq_id: int
    p2p_seq_id: int
    is_p2p: bool
    peer: int
    bytes: int
    dtype: str
    state: str
    time_created_ns: int
    time_completed_ns: int
    duration_ms: float
    algbw_gbs: float
    busbw_gbs: float
    timing_source: str
    host: str
    pid: int
    provenance: Provenance
    def __init__(self, job: _Optional[str] = ..., source: _Optional[str] = ..., op: _Optional[str] = ..., rank: _Optional[int] = ..., raw_op: _Optional[str] = ..., pg_id: _Optional[int] = ..., pg_name: _Optional[str] = ..., pg_desc: _Optional[str] = ..., comm_id: _Optional[str] = ..., pg_ranks_index: _Optional[int] = ..., group_rank: _Optional[int] = ..., group_size: _Optional[int] = ..., nnodes: _Optional[int] = ..., collective_seq_id: _Optional[int] = ..., p2p_seq_id: _Optional[int] = ..., is_p2p: _Optional[bool] = ..., peer: _Optional[int] = ..., bytes: _Optional[int] = ..., dtype: _Optional[str] = ..., state: _Optional[str] = ..., time_created_ns: _Optional[int] = ..., time_completed_ns: _Optional[int] = ..., duration_ms: _Optional[float] = ..., algbw_gbs: _Optional[float] = ..., busbw_gbs: _Optional[float] = ..., timing_source: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., provenance: _Optional[_Union[Provenance, _Mapping]] = ...) -> None: ...

class StepRecord(_message.Message):
    __slots__ = ("job", "iteration", "rank", "scope", "end_time", "train_iters", "step_time_ms", "logged_tflops_per_gpu", "consumed_samples", "global_batch_size", "learning_rate", "lm_loss", "loss_scale", "grad_norm", "skipped_iterations", "nan_iterations", "interval", "fields", "timers", "straggler", "memory_mb", "source", "disturbed_by_capture", "first_of_run", "tokens_per_step", "flops_per_step", "armed", "rank_end_times")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class TimersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Timer
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Timer, _Mapping]] = ...) -> None: ...
    class MemoryMbEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: MemoryReport
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[MemoryReport, _Mapping]] = ...) -> None: ...
    class RankEndTimesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    JOB_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    TRAIN_ITERS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    LOGGED_TFLOPS_PER_GPU_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    LM_LOSS_FIELD_NUMBER: _ClassVar[int]
    LOSS_SCALE_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    NAN_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    TIMERS_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DISTURBED_BY_CAPTURE_FIELD_NUMBER: _ClassVar[int]
    FIRST_OF_RUN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    FLOPS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    ARMED_FIELD_NUMBER: _ClassVar[int]
    RANK_END_TIMES_FIELD_NUMBER: _ClassVar[int]
    job: str
    iteration: int
    rank: int
    scope: str
    end_time: float
    train_iters: int
    step_time_ms: float
    logged_tflops_per_gpu: float
    consumed_samples: int
    global_batch_size: int
    learning_rate: float
    lm_loss: float
    loss_scale: float
    grad_norm: float
    skipped_iterations: int
    nan_iterations: int
    interval: int
    fields: _containers.ScalarMap[str, str]
    timers: _containers.MessageMap[str, Timer]
    straggler: StragglerLine
    memory_mb: _containers.MessageMap[int, MemoryReport]
    source: Provenance
    disturbed_by_capture: bool
    first_of_run: bool
    tokens_per_step: float
    flops_per_step: float
    armed: bool
    rank_end_times: _containers.ScalarMap[int, float]
    def __init__(self, job: _Optional[str] = ..., iteration: _Optional[int] = ..., rank: _Optional[int] = ..., scope: _Optional[str] = ..., end_time: _Optional[float] = ..., train_iters: _Optional[int] = ..., step_time_ms: _Optional[float] = ..., logged_tflops_per_gpu: _Optional[float] = ..., consumed_samples: _Optional[int] = ..., global_batch_size: _Optional[int] = ..., learning_rate: _Optional[float] = ..., lm_loss: _Optional[float] = ..., loss_scale: _Optional[float] = ..., grad_norm: _Optional[float] = ..., skipped_iterations: _Optional[int] = ..., nan_iterations: _Optional[int] = ..., interval: _Optional[int] = ..., fields: _Optional[_Mapping[str, str]] = ..., timers: _Optional[_Mapping[str, Timer]] = ..., straggler: _Optional[_Union[StragglerLine, _Mapping]] = ..., memory_mb: _Optional[_Mapping[int, MemoryReport]] = ..., source: _Optional[_Union[Provenance, _Mapping]] = ..., disturbed_by_capture: _Optional[bool] = ..., first_of_run: _Optional[bool] = ..., tokens_per_step: _Optional[float] = ..., flops_per_step: _Optional[float] = ..., armed: _Optional[bool] = ..., rank_end_times: _Optional[_Mapping[int, float]] = ...) -> None: ...

class Timer(_message.Message):
    __slots__ = ("min_ms", "max_ms", "per_rank")
    class PerRankEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MIN_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MS_FIELD_NUMBER: _ClassVar[int]
    PER_RANK_FIELD_NUMBER: _ClassVar[int]
    min_ms: float
    max_ms: float
    per_rank: _containers.ScalarMap[int, float]
    def __init__(self, min_ms: _Optional[float] = ..., max_ms: _Optional[float] = ..., per_rank: _Optional[_Mapping[int, float]] = ...) -> None: ...

class MemoryReport(_message.Message):
    __slots__ = ("mb",)
    class MbEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MB_FIELD_NUMBER: _ClassVar[int]
    mb: _containers.ScalarMap[str, float]
    def __init__(self, mb: _Optional[_Mapping[str, float]] = ...) -> None: ...

class RankValue(_message.Message):
    __slots__ = ("value", "rank", "unit")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    value: float
    rank: int
    unit: str
    def __init__(self, value: _Optional[float] = ..., rank: _Optional[int] = ..., unit: _Optional[str] = ...) -> None: ...

class StragglerQuantity(_message.Message):
    __slots__ = ("min", "max")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    min: RankValue
    max: RankValue
    def __init__(self, min: _Optional[_Union[RankValue, _Mapping]] = ..., max: _Optional[_Union[RankValue, _Mapping]] = ...) -> None: ...

class StragglerLine(_message.Message):
    __slots__ = ("time", "quantities", "line_no")
    class QuantitiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StragglerQuantity
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[StragglerQuantity, _Mapping]] = ...) -> None: ...
    TIME_FIELD_NUMBER: _ClassVar[int]
    QUANTITIES_FIELD_NUMBER: _ClassVar[int]
    LINE_NO_FIELD_NUMBER: _ClassVar[int]
    time: str
    quantities: _containers.MessageMap[str, StragglerQuantity]
    line_no: int
    def __init__(self, time: _Optional[str] = ..., quantities: _Optional[_Mapping[str, StragglerQuantity]] = ..., line_no: _Optional[int] = ...) -> None: ...

class Provenance(_message.Message):
    __slots__ = ("collector", "detail")
    COLLECTOR_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    collector: str
    detail: str
    def __init__(self, collector: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("time_ns", "kind", "severity", "text", "labels", "job", "links", "payload_json")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LinksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    time_ns: int
    kind: str
    severity: str
    text: str
    labels: _containers.ScalarMap[str, str]
    job: str
    links: _containers.ScalarMap[str, str]
    payload_json: str
    def __init__(self, time_ns: _Optional[int] = ..., kind: _Optional[str] = ..., severity: _Optional[str] = ..., text: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., job: _Optional[str] = ..., links: _Optional[_Mapping[str, str]] = ..., payload_json: _Optional[str] = ...) -> None: ...

class AggregatorMessage(_message.Message):
    __slots__ = ("ack", "command")
    ACK_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ack: Ack
    command: Command
    def __init__(self, ack: _Optional[_Union[Ack, _Mapping]] = ..., command: _Optional[_Union[Command, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("acked_seq",)
    ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    acked_seq: int
    def __init__(self, acked_seq: _Optional[int] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("id", "kind", "job", "ranks", "args")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    job: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    args: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., job: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., args: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Partial(_message.Message):
    __slots__ = ("job", "iteration", "fold", "ranks_le", "job_level", "messages", "new_run")
    JOB_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    FOLD_FIELD_NUMBER: _ClassVar[int]
    RANKS_LE_FIELD_NUMBER: _ClassVar[int]
    JOB_LEVEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEW_RUN_FIELD_NUMBER: _ClassVar[int]
    job: str
    iteration: int
    fold: StepRecord
    ranks_le: bytes
    job_level: _containers.RepeatedCompositeFieldContainer[StepRecord]
    messages: _containers.RepeatedScalarFieldContainer[str]
    new_run: bool
    def __init__(self, job: _Optional[str] = ..., iteration: _Optional[int] = ..., fold: _Optional[_Union[StepRecord, _Mapping]] = ..., ranks_le: _Optional[bytes] = ..., job_level: _Optional[_Iterable[_Union[StepRecord, _Mapping]]] = ..., messages: _Optional[_Iterable[str]] = ..., new_run: _Optional[bool] = ...) -> None: ...

class EngineBatch(_message.Message):
    __slots__ = ("id", "sender", "created_ns", "partials", "job_info_json", "records", "collective_partials", "window_figures", "collectives_folded", "to_partition", "step_summaries", "comm_summaries")
    class JobInfoJsonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    CREATED_NS_FIELD_NUMBER: _ClassVar[int]
    PARTIALS_FIELD_NUMBER: _ClassVar[int]
    JOB_INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_PARTIALS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIGURES_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FOLDED_FIELD_NUMBER: _ClassVar[int]
    TO_PARTITION_FIELD_NUMBER: _ClassVar[int]
    STEP_SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    COMM_SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    id: str
    sender: str
    created_ns: int
    partials: _containers.RepeatedCompositeFieldContainer[Partial]
    job_info_json: _containers.ScalarMap[str, str]
    records: Batch
    collective_partials: _containers.RepeatedCompositeFieldContainer[CollectivePartial]
    window_figures: _containers.RepeatedCompositeFieldContainer[WindowFigures]
    collectives_folded: bool
    to_partition: bool
    step_summaries: _containers.RepeatedCompositeFieldContainer[StepSummary]
    comm_summaries: _containers.RepeatedCompositeFieldContainer[CommSummary]
    def __init__(self, id: _Optional[str] = ..., sender: _Optional[str] = ..., created_ns: _Optional[int] = ..., partials: _Optional[_Iterable[_Union[Partial, _Mapping]]] = ..., job_info_json: _Optional[_Mapping[str, str]] = ..., records: _Optional[_Union[Batch, _Mapping]] = ..., collective_partials: _Optional[_Iterable[_Union[CollectivePartial, _Mapping]]] = ..., window_figures: _Optional[_Iterable[_Union[WindowFigures, _Mapping]]] = ..., collectives_folded: _Optional[bool] = ..., to_partition: _Optional[bool] = ..., step_summaries: _Optional[_Iterable[_Union[StepSummary, _Mapping]]] = ..., comm_summaries: _Optional[_Iterable[_Union[CommSummary, _Mapping]]] = ...) -> None: ...

class StepSummary(_message.Message):
    __slots__ = ("version", "job", "iteration", "partition", "epoch", "seq", "ranks_in", "ranks_expected", "slowest", "end_time", "has_end", "armed", "new_run", "timers", "stages", "stage_unknown", "extremes", "ranks_hash")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    RANKS_IN_FIELD_NUMBER: _ClassVar[int]
    RANKS_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    SLOWEST_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    HAS_END_FIELD_NUMBER: _ClassVar[int]
    ARMED_FIELD_NUMBER: _ClassVar[int]
    NEW_RUN_FIELD_NUMBER: _ClassVar[int]
    TIMERS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    STAGE_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    EXTREMES_FIELD_NUMBER: _ClassVar[int]
    RANKS_HASH_FIELD_NUMBER: _ClassVar[int]
    version: int
    job: str
    iteration: int
    partition: int
    epoch: int
    seq: int
    ranks_in: int
    ranks_expected: int
    slowest: StepRecord
    end_time: float
    has_end: bool
    armed: bool
    new_run: bool
    timers: _containers.RepeatedCompositeFieldContainer[TimerSummary]
    stages: _containers.RepeatedCompositeFieldContainer[StageSummary]
    stage_unknown: bool
    extremes: _containers.RepeatedCompositeFieldContainer[Extreme]
    ranks_hash: int
    def __init__(self, version: _Optional[int] = ..., job: _Optional[str] = ..., iteration: _Optional[int] = ..., partition: _Optional[int] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., ranks_in: _Optional[int] = ..., ranks_expected: _Optional[int] = ..., slowest: _Optional[_Union[StepRecord, _Mapping]] = ..., end_time: _Optional[float] = ..., has_end: _Optional[bool] = ..., armed: _Optional[bool] = ..., new_run: _Optional[bool] = ..., timers: _Optional[_Iterable[_Union[TimerSummary, _Mapping]]] = ..., stages: _Optional[_Iterable[_Union[StageSummary, _Mapping]]] = ..., stage_unknown: _Optional[bool] = ..., extremes: _Optional[_Iterable[_Union[Extreme, _Mapping]]] = ..., ranks_hash: _Optional[int] = ...) -> None: ...

class Extreme(_message.Message):
    __slots__ = ("name", "count", "max", "max_rank", "min", "min_rank", "unknown")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    MAX_RANK_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MIN_RANK_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    max: float
    max_rank: int
    min: float
    min_rank: int
    unknown: bool
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ..., max: _Optional[float] = ..., max_rank: _Optional[int] = ..., min: _Optional[float] = ..., min_rank: _Optional[int] = ..., unknown: _Optional[bool] = ...) -> None: ...

class ExactSum(_message.Message):
    __slots__ = ("partials",)
    PARTIALS_FIELD_NUMBER: _ClassVar[int]
    partials: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, partials: _Optional[_Iterable[float]] = ...) -> None: ...

class CommSummary(_message.Message):
    __slots__ = ("version", "job", "partition", "epoch", "seq", "ranks", "ranks_hash", "share", "weighted", "by", "windows", "top_rank", "top_value", "iterations")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    RANKS_HASH_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    WEIGHTED_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    TOP_RANK_FIELD_NUMBER: _ClassVar[int]
    TOP_VALUE_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    version: int
    job: str
    partition: int
    epoch: int
    seq: int
    ranks: int
    ranks_hash: int
    share: Sketch
    weighted: Sketch
    by: _containers.RepeatedCompositeFieldContainer[ClassSketch]
    windows: int
    top_rank: _containers.RepeatedScalarFieldContainer[int]
    top_value: _containers.RepeatedScalarFieldContainer[float]
    iterations: _containers.RepeatedCompositeFieldContainer[CommIteration]
    def __init__(self, version: _Optional[int] = ..., job: _Optional[str] = ..., partition: _Optional[int] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., ranks: _Optional[int] = ..., ranks_hash: _Optional[int] = ..., share: _Optional[_Union[Sketch, _Mapping]] = ..., weighted: _Optional[_Union[Sketch, _Mapping]] = ..., by: _Optional[_Iterable[_Union[ClassSketch, _Mapping]]] = ..., windows: _Optional[int] = ..., top_rank: _Optional[_Iterable[int]] = ..., top_value: _Optional[_Iterable[float]] = ..., iterations: _Optional[_Iterable[_Union[CommIteration, _Mapping]]] = ...) -> None: ...

class ClassSketch(_message.Message):
    __slots__ = ("name", "sketch")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SKETCH_FIELD_NUMBER: _ClassVar[int]
    name: str
    sketch: Sketch
    def __init__(self, name: _Optional[str] = ..., sketch: _Optional[_Union[Sketch, _Mapping]] = ...) -> None: ...

class CommIteration(_message.Message):
    __slots__ = ("iteration", "ranks", "ranks_hash", "share", "window_ms", "by", "n_iterations", "has_excluded", "excluded_rank", "excluded", "top_rank", "top_value")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    RANKS_HASH_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    N_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    HAS_EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_RANK_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    TOP_RANK_FIELD_NUMBER: _ClassVar[int]
    TOP_VALUE_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    ranks: int
    ranks_hash: int
    share: Sketch
    window_ms: Sketch
    by: _containers.RepeatedCompositeFieldContainer[ClassSketch]
    n_iterations: int
    has_excluded: bool
    excluded_rank: int
    excluded: str
    top_rank: _containers.RepeatedScalarFieldContainer[int]
    top_value: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, iteration: _Optional[int] = ..., ranks: _Optional[int] = ..., ranks_hash: _Optional[int] = ..., share: _Optional[_Union[Sketch, _Mapping]] = ..., window_ms: _Optional[_Union[Sketch, _Mapping]] = ..., by: _Optional[_Iterable[_Union[ClassSketch, _Mapping]]] = ..., n_iterations: _Optional[int] = ..., has_excluded: _Optional[bool] = ..., excluded_rank: _Optional[int] = ..., excluded: _Optional[str] = ..., top_rank: _Optional[_Iterable[int]] = ..., top_value: _Optional[_Iterable[float]] = ...) -> None: ...

class Sketch(_message.Message):
    __slots__ = ("relative_accuracy", "min_key", "counts", "zeros")
    RELATIVE_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    MIN_KEY_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    ZEROS_FIELD_NUMBER: _ClassVar[int]
    relative_accuracy: float
    min_key: int
    counts: _containers.RepeatedScalarFieldContainer[int]
    zeros: int
    def __init__(self, relative_accuracy: _Optional[float] = ..., min_key: _Optional[int] = ..., counts: _Optional[_Iterable[int]] = ..., zeros: _Optional[int] = ...) -> None: ...

class TimerSummary(_message.Message):
    __slots__ = ("name", "count", "sum", "min", "max", "max_rank", "sketch")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    MAX_RANK_FIELD_NUMBER: _ClassVar[int]
    SKETCH_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    sum: ExactSum
    min: float
    max: float
    max_rank: int
    sketch: Sketch
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ..., sum: _Optional[_Union[ExactSum, _Mapping]] = ..., min: _Optional[float] = ..., max: _Optional[float] = ..., max_rank: _Optional[int] = ..., sketch: _Optional[_Union[Sketch, _Mapping]] = ...) -> None: ...

class StageSummary(_message.Message):
    __slots__ = ("stage", "count", "sum", "top_rank", "top_value", "sketch")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    TOP_RANK_FIELD_NUMBER: _ClassVar[int]
    TOP_VALUE_FIELD_NUMBER: _ClassVar[int]
    SKETCH_FIELD_NUMBER: _ClassVar[int]
    stage: int
    count: int
    sum: ExactSum
    top_rank: _containers.RepeatedScalarFieldContainer[int]
    top_value: _containers.RepeatedScalarFieldContainer[float]
    sketch: Sketch
    def __init__(self, stage: _Optional[int] = ..., count: _Optional[int] = ..., sum: _Optional[_Union[ExactSum, _Mapping]] = ..., top_rank: _Optional[_Iterable[int]] = ..., top_value: _Optional[_Iterable[float]] = ..., sketch: _Optional[_Union[Sketch, _Mapping]] = ...) -> None: ...

class WindowFigures(_message.Message):
    __slots__ = ("job", "iteration", "rank", "start_ns", "end_ns", "n_iterations", "comm_ns", "basis", "settled", "excluded_names", "excluded", "by")
    JOB_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    N_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    COMM_NS_FIELD_NUMBER: _ClassVar[int]
    BASIS_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_NAMES_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    job: str
    iteration: _containers.RepeatedScalarFieldContainer[int]
    rank: _containers.RepeatedScalarFieldContainer[int]
    start_ns: _containers.RepeatedScalarFieldContainer[int]
    end_ns: _containers.RepeatedScalarFieldContainer[int]
    n_iterations: _containers.RepeatedScalarFieldContainer[int]
    comm_ns: _containers.RepeatedScalarFieldContainer[int]
    basis: _containers.RepeatedScalarFieldContainer[int]
    settled: _containers.RepeatedScalarFieldContainer[bool]
    excluded_names: _containers.RepeatedScalarFieldContainer[str]
    excluded: _containers.RepeatedScalarFieldContainer[int]
    by: _containers.RepeatedCompositeFieldContainer[WindowClass]
    def __init__(self, job: _Optional[str] = ..., iteration: _Optional[_Iterable[int]] = ..., rank: _Optional[_Iterable[int]] = ..., start_ns: _Optional[_Iterable[int]] = ..., end_ns: _Optional[_Iterable[int]] = ..., n_iterations: _Optional[_Iterable[int]] = ..., comm_ns: _Optional[_Iterable[int]] = ..., basis: _Optional[_Iterable[int]] = ..., settled: _Optional[_Iterable[bool]] = ..., excluded_names: _Optional[_Iterable[str]] = ..., excluded: _Optional[_Iterable[int]] = ..., by: _Optional[_Iterable[_Union[WindowClass, _Mapping]]] = ...) -> None: ...

class WindowClass(_message.Message):
    __slots__ = ("name", "union_ns")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UNION_NS_FIELD_NUMBER: _ClassVar[int]
    name: str
    union_ns: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., union_ns: _Optional[_Iterable[int]] = ...) -> None: ...

class CollectivePartial(_message.Message):
    __slots__ = ("job", "strings", "groups", "source", "op", "group", "state", "host", "unset", "is_p2p", "rank", "pg_id", "group_rank", "group_size", "nnodes", "collective_seq_id", "peer", "bytes", "time_created_delta_ns", "pid", "duration_ms", "busbw_gbs", "p2p_seq_id", "duration_ms_f32", "progress_rank", "progress_group", "progress_p2p", "progress_enqueued", "progress_completed")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STRINGS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    UNSET_FIELD_NUMBER: _ClassVar[int]
    IS_P2P_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PG_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_RANK_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    NNODES_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TIME_CREATED_DELTA_NS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    BUSBW_GBS_FIELD_NUMBER: _ClassVar[int]
    P2P_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_F32_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_RANK_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_GROUP_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_P2P_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    job: str
    strings: _containers.RepeatedScalarFieldContainer[str]
    groups: _containers.RepeatedCompositeFieldContainer[CollectiveGroup]
    source: _containers.RepeatedScalarFieldContainer[int]
    op: _containers.RepeatedScalarFieldContainer[int]
    group: _containers.RepeatedScalarFieldContainer[int]
    state: _containers.RepeatedScalarFieldContainer[int]
    host: _containers.RepeatedScalarFieldContainer[int]
    unset: _containers.RepeatedScalarFieldContainer[int]
    is_p2p: _containers.RepeatedScalarFieldContainer[bool]
    rank: _containers.RepeatedScalarFieldContainer[int]
    pg_id: _containers.RepeatedScalarFieldContainer[int]
    group_rank: _containers.RepeatedScalarFieldContainer[int]
    group_size: _containers.RepeatedScalarFieldContainer[int]
    nnodes: _containers.RepeatedScalarFieldContainer[int]
    collective_seq_id: _containers.RepeatedScalarFieldContainer[int]
    peer: _containers.RepeatedScalarFieldContainer[int]
    bytes: _containers.RepeatedScalarFieldContainer[int]
    time_created_delta_ns: _containers.RepeatedScalarFieldContainer[int]
    pid: _containers.RepeatedScalarFieldContainer[int]
    duration_ms: _containers.RepeatedScalarFieldContainer[float]
    busbw_gbs: _containers.RepeatedScalarFieldContainer[float]
    p2p_seq_id: _containers.RepeatedScalarFieldContainer[int]
    duration_ms_f32: _containers.RepeatedScalarFieldContainer[float]
    progress_rank: _containers.RepeatedScalarFieldContainer[int]
    progress_group: _containers.RepeatedScalarFieldContainer[int]
    progress_p2p: _containers.RepeatedScalarFieldContainer[bool]
    progress_enqueued: _containers.RepeatedScalarFieldContainer[int]
    progress_completed: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job: _Optional[str] = ..., strings: _Optional[_Iterable[str]] = ..., groups: _Optional[_Iterable[_Union[CollectiveGroup, _Mapping]]] = ..., source: _Optional[_Iterable[int]] = ..., op: _Optional[_Iterable[int]] = ..., group: _Optional[_Iterable[int]] = ..., state: _Optional[_Iterable[int]] = ..., host: _Optional[_Iterable[int]] = ..., unset: _Optional[_Iterable[int]] = ..., is_p2p: _Optional[_Iterable[bool]] = ..., rank: _Optional[_Iterable[int]] = ..., pg_id: _Optional[_Iterable[int]] = ..., group_rank: _Optional[_Iterable[int]] = ..., group_size: _Optional[_Iterable[int]] = ..., nnodes: _Optional[_Iterable[int]] = ..., collective_seq_id: _Optional[_Iterable[int]] = ..., peer: _Optional[_Iterable[int]] = ..., bytes: _Optional[_Iterable[int]] = ..., time_created_delta_ns: _Optional[_Iterable[int]] = ..., pid: _Optional[_Iterable[int]] = ..., duration_ms: _Optional[_Iterable[float]] = ..., busbw_gbs: _Optional[_Iterable[float]] = ..., p2p_seq_id: _Optional[_Iterable[int]] = ..., duration_ms_f32: _Optional[_Iterable[float]] = ..., progress_rank: _Optional[_Iterable[int]] = ..., progress_group: _Optional[_Iterable[int]] = ..., progress_p2p: _Optional[_Iterable[bool]] = ..., progress_enqueued: _Optional[_Iterable[int]] = ..., progress_completed: _Optional[_Iterable[int]] = ...) -> None: ...

class CollectiveGroup(_message.Message):
    __slots__ = ("pg_name", "comm_id", "pg_desc", "has_ranks", "ranks_runs")
    PG_NAME_FIELD_NUMBER: _ClassVar[int]
    COMM_ID_FIELD_NUMBER: _ClassVar[int]
    PG_DESC_FIELD_NUMBER: _ClassVar[int]
    HAS_RANKS_FIELD_NUMBER: _ClassVar[int]
    RANKS_RUNS_FIELD_NUMBER: _ClassVar[int]
    pg_name: int
    comm_id: int
    pg_desc: int
    has_ranks: bool
    ranks_runs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, pg_name: _Optional[int] = ..., comm_id: _Optional[int] = ..., pg_desc: _Optional[int] = ..., has_ranks: _Optional[bool] = ..., ranks_runs: _Optional[_Iterable[int]] = ...) -> None: ...
