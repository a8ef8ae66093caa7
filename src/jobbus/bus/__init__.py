"""The message bus: messages under stable wire names, inline and queued handlers, envelopes and codecs."""

from jobbus.bus.bus import (
    BUS_JOB_TYPE,
    JOB_TYPE_PREFIX,
    MAX_BINDING_NAME_BYTES,
    Binding,
    DispatchResult,
    MessageBus,
    MessageType,
    SyncMessageBus,
    binding_job_type,
)
from jobbus.bus.codecs import Codec, CodecError, JsonCodec
from jobbus.bus.envelope import (
    ENVELOPE_VERSION,
    CorrelationIdFilter,
    Envelope,
    EnvelopeError,
    current_correlation_id,
)

__all__ = [
    "BUS_JOB_TYPE",
    "ENVELOPE_VERSION",
    "JOB_TYPE_PREFIX",
    "MAX_BINDING_NAME_BYTES",
    "Binding",
    "Codec",
    "CodecError",
    "CorrelationIdFilter",
    "DispatchResult",
    "Envelope",
    "EnvelopeError",
    "JsonCodec",
    "MessageBus",
    "MessageType",
    "SyncMessageBus",
    "binding_job_type",
    "current_correlation_id",
]
