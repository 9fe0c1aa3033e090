"""The entry of the client commands: their parsers, running the one chosen, and printing failures.

Standard library only at module level (see ``streamingnode.cli``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from streamingnode.cli import admin
from streamingnode.cli import backup as backup_cli
from streamingnode.cli.connection import (
    ADDR_ENV,
    DEFAULT_ADDR,
    TOKEN_ENV,
    resolve_addr,
    resolve_credentials,
    use_credentials,
)
from streamingnode.cli.consume import consume as consume_command
from streamingnode.cli.parsing import CliError, non_negative_float, non_negative_int, positive_int
from streamingnode.cli.produce import produce as produce_command
from streamingnode.wire.defaults import LINGER, MAX_BATCH_BYTES, RECONNECT_TIMEOUT

if TYPE_CHECKING:
    from wal.errors import StreamingError

# What gRPC's resolver says when a host name has no address (c-ares and the native resolver alike).
_DNS_FAILURE = re.compile(r"resolv|DNS|name not found|lookup failed|Name or service not known", re.IGNORECASE)

CLIENT_COMMANDS = frozenset({"produce", "consume", "channels", "groups", "flush", "token", "backup"})

Handler = Callable[[argparse.Namespace, str], Coroutine[Any, Any, int]]


def add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register produce, consume, channels, groups and flush on the top-level subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--addr", action="append", help=f"node address; in a cluster repeat it or give a comma "
                        f"list of seeds (default ${ADDR_ENV} or {DEFAULT_ADDR})")
    common.add_argument("--token", help=f"bearer token sent on every call (default ${TOKEN_ENV}; prefer the "
                        "variable: a flag shows in the process list)")
    common.add_argument("--tls-ca", help="CA file (PEM) to verify the node's certificate with: connect over TLS")
    common.add_argument("--tls-cert", help="client certificate (PEM) for mutual TLS (with --tls-key)")
    common.add_argument("--tls-key", help="private key (PEM) of --tls-cert")
    streaming = argparse.ArgumentParser(add_help=False)
    streaming.add_argument("--reconnect-timeout", type=non_negative_float, default=RECONNECT_TIMEOUT,
                           metavar="SECONDS",
                           help="how long a broken stream keeps trying to reconnect before the command fails "
                           f"(default {RECONNECT_TIMEOUT:g}); a line on stderr says when it broke and when it is back")
    exists = argparse.ArgumentParser(add_help=False)
    exists.add_argument("--if-not-exists", action="store_true",
                        help="what exists already is no error: say so and go on (scripts can run twice)")
    json_out = argparse.ArgumentParser(add_help=False)
    json_out.add_argument("--json", action="store_true", help="print JSON instead of a table")

    produce = sub.add_parser(
        "produce", parents=[common, streaming], help="append messages: lines from stdin, or generated load",
        description="Append messages to a pchannel and wait until every one is durable.  Without --count, "
        "each stdin line is one message.  --format json (default): a JSON object {\"vchannel\"?, "
        "\"payload\" (string) or \"payload_b64\", \"properties\"?: {str: str}} or any other JSON value, "
        "whose JSON text becomes the payload.  --format raw: the line's bytes are the payload; with "
        "-K DELIM, the text before the first DELIM is the vchannel.  "
        "With --count N, N generated messages of --size bytes are sent.  A summary line (messages, bytes, "
        "rate, ack latency) goes to stderr.")
    produce.add_argument("--channel", required=True, help="the pchannel")
    produce.add_argument("--vchannel", default="",
                         help="vchannel of messages that name none (default '': broadcast to every vchannel)")
    produce.add_argument("--format", choices=["json", "raw"], default="json",
                         help="stdin lines: json (default; see above) or raw (each line is the payload)")
    produce.add_argument("-K", "--vchannel-delimiter", metavar="DELIM",
                         help="--format raw: each line is VCHANNEL<DELIM>PAYLOAD (a line without DELIM goes to "
                              "--vchannel), like kcat's -K")
    produce.add_argument("--count", type=positive_int, help="send N generated messages instead of reading stdin")
    produce.add_argument("--size", type=non_negative_int, help="payload bytes of generated messages (default 1024)")
    produce.add_argument("--producer-id",
                         help="make the producer idempotent under this id: batches unanswered when the "
                              "connection breaks are resent without duplicates, and a later run with the same id "
                              "continues its sequences (the node hands out the next one and a new epoch, which "
                              "fences a run still going under the id).  The node stamps producer_id/producer_seq "
                              "properties on each message.  Without it, such a batch fails the command (it may or "
                              "may not have been appended)")
    produce.add_argument("--linger", type=non_negative_float, default=LINGER,
                         help=f"seconds a batch waits for more messages (default {LINGER:g})")
    produce.add_argument("--batch-bytes", type=positive_int, default=MAX_BATCH_BYTES,
                         help=f"largest batch in bytes (default {MAX_BATCH_BYTES >> 20} MiB)")
    produce.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                         help="progress bar on stderr (default: when stderr is a terminal and stdin is not "
                              "one, so that typing is not drawn over)")
    produce.set_defaults(client_handler=produce_command)

    consume = sub.add_parser(
        "consume", parents=[common, streaming], help="print messages as JSON lines",
        description="Print messages as JSON lines {id, vchannel, type, timetick, time, txn_id?, properties, "
        "payload or payload_b64} (time: the timetick's UTC time), until --count messages, the end of the log "
        "(--exit) or Ctrl-C / SIGTERM (exit 0).  TimeTicks are not printed.  --format raw prints, as kcat does, "
        "each message's payload bytes unchanged followed by the -D delimiter (default a newline), with "
        "-K DELIM the vchannel and DELIM before it; without --type, only messages that carry a payload "
        "(not transaction framing).")
    consume.add_argument("--channel", required=True, help="the pchannel")
    consume.add_argument("--vchannel", default="", help="read one vchannel (default: the whole pchannel)")
    consume.add_argument("--from", dest="start", default="earliest", metavar="WHERE",
                         help="earliest (default), latest, a message id (an integer), or a time: ISO-8601 "
                              "with its zone (Z or +01:00; refused without one) or @UNIX_SECONDS")
    consume.add_argument("--group", help="consume as this consumer group: start at its committed position "
                                         "(when it has one) and ack each pack once printed")
    consume.add_argument("--count", type=positive_int, help="stop after N messages")
    consume.add_argument("-e", "--exit", action="store_true",
                         help="stop at the end of the log: after the newest message there was at the start")
    consume.add_argument("--type", dest="types", action="append", metavar="TYPE",
                         help="print only messages of this type (DATA, INSERT, DELETE, BEGIN_TXN, ...; repeat it "
                              "or give a comma list)")
    consume.add_argument("--quiet", action="store_true", help="no status line on stderr")
    consume.add_argument("--format", choices=["json", "raw"], default="json",
                         help="json (default): one JSON object per line; raw: each payload's bytes, then -D")
    consume.add_argument("-K", "--vchannel-delimiter", metavar="DELIM",
                         help="--format raw: print VCHANNEL<DELIM> before each payload (what produce's -K reads), "
                              "like kcat's -K")
    consume.add_argument("-D", "--delimiter", metavar="DELIM",
                         help="--format raw: what follows each payload (default \\n; the escapes \\n \\t \\r "
                              "\\0 \\\\ are decoded, '' for nothing), like kcat's -D")
    consume.set_defaults(client_handler=consume_command)

    channels = sub.add_parser("channels", help="create, list, describe, destroy pchannels")
    csub = channels.add_subparsers(dest="action", required=True)
    create = csub.add_parser("create", parents=[common, json_out, exists], help="create pchannels")
    create.add_argument("names", nargs="*", metavar="NAME")
    create.add_argument("--num", type=positive_int, help="create N channels named by the node (without NAMEs)")
    create.add_argument("--role", default="", help="owner role")
    create.add_argument("--address", default="", help="owner address")
    create.add_argument("--description", default="", help="owner description")
    create.set_defaults(client_handler=admin.channels_create)
    lst = csub.add_parser("list", parents=[common, json_out], help="every pchannel of the node")
    lst.set_defaults(client_handler=admin.channels_list)
    describe = csub.add_parser("describe", parents=[common, json_out], help="owner, term, ids, last time")
    describe.add_argument("names", nargs="+", metavar="NAME")
    describe.set_defaults(client_handler=admin.channels_describe)
    destroy = csub.add_parser("destroy", parents=[common], help="remove pchannels with their data and groups")
    destroy.add_argument("names", nargs="+", metavar="NAME")
    destroy.set_defaults(client_handler=admin.channels_destroy)

    groups = sub.add_parser("groups", help="create, destroy, list, describe, seek consumer groups")
    gsub = groups.add_subparsers(dest="action", required=True)
    gcreate = gsub.add_parser("create", parents=[common, exists], help="create consumer groups on a pchannel")
    gcreate.add_argument("--channel", required=True, help="the pchannel")
    gcreate.add_argument("names", nargs="+", metavar="GROUP")
    gcreate.set_defaults(client_handler=admin.groups_create)
    gdestroy = gsub.add_parser("destroy", parents=[common], help="remove consumer groups")
    gdestroy.add_argument("--channel", required=True, help="the pchannel")
    gdestroy.add_argument("names", nargs="+", metavar="GROUP")
    gdestroy.set_defaults(client_handler=admin.groups_destroy)
    glist = gsub.add_parser("list", parents=[common, json_out], help="consumer groups (of every pchannel)")
    glist.add_argument("--channel", default="", help="only this pchannel")
    glist.set_defaults(client_handler=admin.groups_list)
    gdescribe = gsub.add_parser("describe", parents=[common, json_out], help="committed positions and lag")
    gdescribe.add_argument("--channel", default="", help="only this pchannel")
    gdescribe.add_argument("names", nargs="*", metavar="GROUP", help="default: every group")
    gdescribe.set_defaults(client_handler=admin.groups_describe)
    gseek = gsub.add_parser("seek", parents=[common, json_out], help="move a group's committed position")
    gseek.add_argument("--channel", required=True, help="the pchannel")
    gseek.add_argument("name", metavar="GROUP")
    gseek.add_argument("--vchannel", default="", help="the vchannel (default '': whole-pchannel consumers)")
    gseek.add_argument("--to", dest="target", required=True, metavar="WHERE",
                       help="earliest, latest, a message id, or a time (ISO-8601 or @UNIX_SECONDS)")
    gseek.set_defaults(client_handler=admin.groups_seek)

    flush = sub.add_parser("flush", parents=[common, json_out], help="flush a vchannel to Parquet")
    flush.add_argument("--channel", required=True, help="the pchannel")
    flush.add_argument("--vchannel", required=True, help="the vchannel")
    flush.add_argument("--collection", help="only this collection")
    flush.set_defaults(client_handler=admin.flush)
    backup_cli.add_backup(sub, common)

    token = sub.add_parser("token", help="bearer tokens for the node's tokens file")
    tsub = token.add_subparsers(dest="action", required=True)
    thash = tsub.add_parser(
        "hash", help="print the SHA-256 of a token read from stdin (the tokens file's sha256 value)",
        description="Read a token from stdin (its first line, without the line end) and print its SHA-256 "
        "in hex, for the sha256 key of a [[token]] entry of the node's tokens file.  Reading stdin keeps "
        "the token out of the shell history and the process list.")
    thash.set_defaults(client_handler=token_hash)


async def token_hash(args: argparse.Namespace, addr: str) -> int:
    """``streamingnode token hash``: the SHA-256 of the token on stdin."""
    from streamingnode.server.auth import hash_token  # noqa: PLC0415

    token = sys.stdin.readline().rstrip("\r\n")
    if not token:
        raise CliError("no token on stdin (e.g. `printf %s \"$TOKEN\" | streamingnode token hash`)")
    print(hash_token(token))
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the client command ``args`` selected; the process exit code."""
    from wal.errors import StreamingError  # noqa: PLC0415

    addr = resolve_addr(args)
    use_credentials(resolve_credentials(args))
    handler: Handler = args.client_handler
    try:
        return asyncio.run(handler(args, addr))
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except StreamingError as exc:
        print_error(exc, addr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`consume | head`): not an error of ours.  Point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def print_error(exc: StreamingError, addr: str) -> None:
    """Print what the node (or the transport) answered: ``error: CODE: message``, and a hint when
    the node may not be running."""
    from wal.errors import ErrorCode  # noqa: PLC0415

    # A status made by gRPC itself starts its text with the code's name already.
    text = str(exc).removeprefix(f"{exc.code.name}: ")
    print(f"error: {exc.code.name}: {text}", file=sys.stderr)
    # UNAVAILABLE made by gRPC itself (it carries the transport's status, not a node's ErrorInfo):
    # nothing answered at that address.  A node that answers UNAVAILABLE is running.
    if exc.code is ErrorCode.UNAVAILABLE and exc.fields.get("grpc_status") == "UNAVAILABLE":
        if _DNS_FAILURE.search(text):
            print(f"hint: a host name of {addr} does not resolve (DNS): check its spelling, or point "
                  f"--addr / ${ADDR_ENV} at the node.", file=sys.stderr)
        else:
            print(f"hint: is the node running at {addr}?  Start one with `streamingnode serve`, or point "
                  f"--addr / ${ADDR_ENV} at it.", file=sys.stderr)
    elif exc.code is ErrorCode.UNAUTHENTICATED:
        print(f"hint: the node wants a bearer token: --token or ${TOKEN_ENV}.", file=sys.stderr)


__all__ = ["CLIENT_COMMANDS", "add_client_commands", "print_error", "run", "token_hash"]
