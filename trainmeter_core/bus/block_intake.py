"""How the hub takes in a block: one typed decode of a producer's bytes, and the check that lets it be numbered as
its rows. A block that this way cannot take (a field of a newer writer, bytes that are not a block) goes through the
hub's general check of a record, which decides; nothing here does I/O or is done per row in Python.
"""

import msgspec

from trainmeter_core.model import records


class _KnownBlock(records.Block, forbid_unknown_fields=True):
    """A block of no field this version does not know (one that has any takes the general check, which keeps it)."""


_typed_block_decoder = msgspec.msgpack.Decoder(_KnownBlock, ext_hook=records.reject_extension)


def looks_like_block(payload) -> bool:
    """Whether a payload starts as msgspec writes a block: its tag first (``records.leading_kind``, a look at a few
    bytes)."""
    return records.leading_kind(payload) == "block"


def typed_block(payload) -> records.Block | None:
    """A producer's block in one typed decode, for the hub to take in bulk: the general check decodes every record
    twice (untyped, to keep fields this version does not know, then typed), which is a third of a block's cost in
    the hub. None for anything else, or for a block this decode refuses: the general check then decides (it refuses
    a malformed block with its reason, and keeps one of a newer writer)."""
    if not looks_like_block(payload):
        return None
    return decode_block(payload)


def decode_block(payload) -> records.Block | None:
    """``typed_block`` of a payload whose tag the caller already read as ``block``."""
    try:
        return _typed_block_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):
        return None


def check(block: records.Block) -> None:
    """A block the hub may number: its columns agree with its rows (``records.block.validate``) and it has rows, for
    a block of none would take no sequence number of its own. Raises MalformedRecord, one line."""
    records.block.validate(block)
    if block.rows < 1:
        raise records.MalformedRecord("block: no rows")
