"""Synchronous Journal RPCs for gazctl: dialing a broker, listing all journals, applying in batches."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import grpc

from broker.protocol import pb, pb_grpc
from gazctl.config import DialTarget
from gazctl.errors import BrokerError

log = logging.getLogger(__name__)

MAX_RECEIVE_BYTES = 16 << 20
"""Largest message the client accepts, as Gazette's client (16 MiB)."""

_HINTS = {
    pb.ETCD_TRANSACTION_FAILED: (
        " (a journal's current revision differs from the spec's `revision`: it was changed, created or"
        " deleted since it was listed; list the journals again, or use `revision: -1` to overwrite)"
    ),
}


@contextmanager
def journal_client(target: DialTarget) -> Iterator[pb_grpc.JournalStub]:
    """Yield a Journal stub on a channel to `target`, closed on exit; a failed RPC raises BrokerError."""
    options = [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)]
    if target.tls:
        channel = grpc.secure_channel(target.target, grpc.ssl_channel_credentials(), options=options)
    else:
        channel = grpc.insecure_channel(target.target, options=options)
    with channel:
        try:
            yield pb_grpc.JournalStub(channel)
        except grpc.RpcError as err:
            raise BrokerError(rpc_message(err, target.address)) from None


def rpc_message(err: grpc.RpcError, address: str) -> str:
    """One line describing a failed RPC: the broker, the status code, and the broker's details as-is."""
    if not isinstance(err, grpc.Call):
        return f"broker {address}: {err}"
    code, details = err.code(), err.details()
    hint = ""
    if code == grpc.StatusCode.UNAVAILABLE:
        hint = " (is a broker listening there? set --broker.address or $BROKER_ADDRESS)"
    return f"broker {address}: {code.name}: {details}{hint}"


def list_journals(stub: pb_grpc.JournalStub, selector: pb.LabelSelector) -> pb.ListResponse:
    """Return every journal matching `selector` as one ListResponse, joining the streamed snapshot."""
    out: pb.ListResponse | None = None
    for resp in stub.List(pb.ListRequest(selector=selector)):
        if out is None:
            if resp.status != pb.OK:
                raise BrokerError(f"List failed: {pb.Status.Name(resp.status)}")
            out = resp
        else:
            out.journals.extend(resp.journals)
    return out if out is not None else pb.ListResponse()


def apply_in_batches(
    stub: pb_grpc.JournalStub, changes: Sequence[pb.ApplyRequest.Change], max_txn_size: int
) -> pb.ApplyResponse:
    """Apply `changes` in one request, or in batches of `max_txn_size` if > 0; return the last response.

    Each batch is its own transaction: when one fails, the batches before it stay applied.
    """
    size = max_txn_size if max_txn_size > 0 else max(len(changes), 1)
    resp = pb.ApplyResponse()
    for begin in range(0, len(changes), size):
        batch = changes[begin : begin + size]
        resp = stub.Apply(pb.ApplyRequest(changes=batch))
        if resp.status != pb.OK:
            applied = f" ({begin} of {len(changes)} changes were applied by earlier batches)" if begin else ""
            hint = _HINTS.get(resp.status, "")
            raise BrokerError(f"Apply failed: {pb.Status.Name(resp.status)}{hint}{applied}")
        log.debug("applied batch", extra={"changes": len(batch), "revision": resp.header.etcd.revision})
    return resp
