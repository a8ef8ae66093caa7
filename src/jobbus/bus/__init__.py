"""The message bus: messages under stable wire names, inline and queued handlers, envelopes and codecs."""

from jobbus.bus.bus import BUS_JOB_TYPE, Binding, DispatchResult, JobIds, MessageBus, MessageType, SyncMessageBus
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
    "Binding",
    "Codec",
    "CodecError",
    "CorrelationIdFilter",
    "DispatchResult",
    "Envelope",
    "EnvelopeError",
    "JobIds",
    "JsonCodec",
    "MessageBus",
    "MessageType",
    "SyncMessageBus",
    "current_correlation_id",
]
