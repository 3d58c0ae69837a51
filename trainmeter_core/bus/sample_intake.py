"""How the hub takes in a GPU sample: one typed decode of a producer's bytes, where the general check of a record
decodes it twice (untyped, to keep fields this version does not know, then typed). A job hub takes every node's GPU
samples, each about 1 KB, and they were most of its work per node (docs/performance.md, "The job hub"). A sample this
way cannot take (a field of a newer writer, at its top or in a process of its list, or bytes that are not a sample)
goes through the general check, which decides; nothing here does I/O.
"""

import msgspec

from trainmeter_core.model import records
from trainmeter_core.model.records.samples import GpuProcess


class _KnownGpuProcess(GpuProcess, forbid_unknown_fields=True):
    """A process of a sample's list, of no field this version does not know."""


def _known(cls: type, nested: dict[str, object]) -> type:
    """``cls`` with the same fields, in the same order, under the same tag and options, refusing a field this version
    does not know; the fields named in ``nested`` take the type given there (a list of known processes). So a record
    decoded by it encodes to the same bytes as ``cls`` would."""
    config = cls.__struct_config__
    fields: list[tuple] = []
    for f in msgspec.structs.fields(cls):
        of = nested.get(f.name, f.type)
        if f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, of, msgspec.field(default_factory=f.default_factory)))
        elif f.default is not msgspec.NODEFAULT:
            fields.append((f.name, of, f.default))
        else:
            fields.append((f.name, of))
    return msgspec.defstruct(
        f"_Known{cls.__name__}",
        fields,
        kw_only=True,
        omit_defaults=config.omit_defaults,
        forbid_unknown_fields=True,
        tag=config.tag,
        tag_field=config.tag_field,
    )


KnownSampleGpu = _known(records.SampleGpu, {"processes": list[_KnownGpuProcess]})
_decoder = msgspec.msgpack.Decoder(KnownSampleGpu, ext_hook=records.reject_extension)
#: The kind taken here.
KIND = "sample.gpu"


def typed_sample(payload) -> msgspec.Struct | None:
    """A producer's GPU sample in one typed decode, or None: for anything that is not a ``sample.gpu`` by its tag, and
    for a sample this decode refuses (the general check then refuses it with its reason, or keeps a newer writer's
    fields)."""
    if records.leading_kind(payload) != KIND:
        return None
    return decode_sample(payload)


def decode_sample(payload) -> msgspec.Struct | None:
    """``typed_sample`` of a payload whose tag the caller already read as ``sample.gpu``."""
    try:
        return _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):
        return None
