"""The records every trainmeter process exchanges: one msgspec Struct per kind, each defined once in the module of
its family, and here the one tagged union of every kind, the codec built from it, and every public name.

The records package is the contract between processes and the only place a record kind is defined. It is pure: no
I/O, no clock. Every field of every kind is pinned; a field that cannot be known is left out and named in ``absent``
with its reason, never filled with a zero. A new kind goes into its family's module and into ``AnyRecord`` below.
"""

from trainmeter_core.model.records.block import ROW_KINDS, Block
from trainmeter_core.model.records.bus import BusStats, ClockMap, NodeEvent, producer_key
from trainmeter_core.model.records.codec import (
    Checked,
    MalformedRecord,
    UnionCodec,
    Unknown,
    encode,
    encode_many,
    kind_of,
    leading_kind,
    reject_extension,
    split_batch,
    to_builtins,
    to_log_line,
    topic,
)
from trainmeter_core.model.records.derived import (
    DERIVED_KINDS,
    Alert,
    AttemptStat,
    Explain,
    ExplainInput,
    HistoryDelta,
    HistoryRequest,
    HistorySync,
    MetricValue,
    NodeStat,
    RankStat,
    SeriesPoint,
    Severity,
    Snapshot,
)
from trainmeter_core.model.records.header import SCHEMA_VERSION, UNSTAMPED_VERSION, Record
from trainmeter_core.model.records.lifetime import (
    PROTOCOL_VERSION,
    Bye,
    Component,
    Hello,
    JobIdentity,
    JobPlace,
    PluginInfo,
    RunEnd,
    RunStart,
)
from trainmeter_core.model.records.loop import (
    Fact,
    Metric,
    Notice,
    Phase,
    PhaseName,
    Provenance,
    Step,
    Tick,
    TokenSource,
)
from trainmeter_core.model.records.profiles import (
    HtaBreakdown,
    KernelStat,
    ProfileAchieved,
    ProfileImport,
    ProfileView,
)
from trainmeter_core.model.records.samples import (
    DiskStat,
    FsStat,
    GpuProcess,
    NetStat,
    ProcessStat,
    SampleGpu,
    SampleHost,
    SampleNode,
)

#: Every kind a record may be: the union msgspec decodes by the ``kind`` tag.
AnyRecord = (
    RunStart
    | RunEnd
    | Hello
    | Bye
    | Fact
    | Step
    | Block
    | Metric
    | Phase
    | Notice
    | Tick
    | NodeEvent
    | ClockMap
    | SampleGpu
    | SampleHost
    | SampleNode
    | Snapshot
    | HistoryDelta
    | HistoryRequest
    | HistorySync
    | Alert
    | Component
    | BusStats
    | ProfileImport
)

_union_codec = UnionCodec(AnyRecord)
#: kind -> Struct class
KINDS: dict[str, type[Record]] = _union_codec.kinds
#: kind -> the field names a record of that kind may carry (the tag included)
FIELDS: dict[str, frozenset[str]] = _union_codec.fields
check = _union_codec.check
check_batch = _union_codec.check_batch
decode = _union_codec.decode
decode_published = _union_codec.decode_published
from_log_line = _union_codec.from_log_line
from_mapping = _union_codec.from_mapping

__all__ = [
    "DERIVED_KINDS",
    "FIELDS",
    "KINDS",
    "PROTOCOL_VERSION",
    "SCHEMA_VERSION",
    "UNSTAMPED_VERSION",
    "ROW_KINDS",
    "Alert",
    "AnyRecord",
    "Block",
    "AttemptStat",
    "BusStats",
    "Bye",
    "Checked",
    "ClockMap",
    "Component",
    "DiskStat",
    "Explain",
    "ExplainInput",
    "Fact",
    "FsStat",
    "GpuProcess",
    "Hello",
    "HistoryDelta",
    "HistoryRequest",
    "HistorySync",
    "HtaBreakdown",
    "JobIdentity",
    "JobPlace",
    "KernelStat",
    "MalformedRecord",
    "Metric",
    "MetricValue",
    "NetStat",
    "NodeEvent",
    "NodeStat",
    "Notice",
    "Phase",
    "PhaseName",
    "PluginInfo",
    "ProcessStat",
    "ProfileAchieved",
    "ProfileImport",
    "ProfileView",
    "Provenance",
    "RankStat",
    "Record",
    "RunEnd",
    "RunStart",
    "SampleGpu",
    "SampleHost",
    "SampleNode",
    "SeriesPoint",
    "Severity",
    "Snapshot",
    "Step",
    "Tick",
    "TokenSource",
    "UnionCodec",
    "Unknown",
    "check",
    "check_batch",
    "decode",
    "decode_published",
    "encode",
    "encode_many",
    "from_log_line",
    "from_mapping",
    "kind_of",
    "leading_kind",
    "producer_key",
    "reject_extension",
    "split_batch",
    "to_builtins",
    "to_log_line",
    "topic",
]
