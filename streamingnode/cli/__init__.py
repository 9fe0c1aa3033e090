"""The client commands of ``streamingnode``: produce, consume, channels, groups and flush.

They talk to a running node over gRPC through ``streamingnode.client.AsyncClient``.  The node's
address is ``--addr`` (repeatable, or a comma list: seeds of a cluster), else ``$STREAMINGNODE_ADDR``,
else ``localhost:19530``.  Every failure the node
reports prints ``error: CODE: message`` on stderr and exits 1.

- ``entry``: the parsers of every command, running the one chosen, printing failures.
- ``produce``, ``consume``: the two streaming commands.
- ``admin``: ``channels``, ``groups`` and ``flush``.
- ``parsing``: the text forms read and printed (times, positions, input lines, argument values).
- ``connection``: which node, and the first call that proves it is there.

Only the standard library is imported at module level, in every module of this package:
``streamingnode --help`` builds these parsers, and it must not pay for grpc, protobuf and the WAL.
"""

from streamingnode.cli.connection import DEFAULT_ADDR
from streamingnode.cli.entry import CLIENT_COMMANDS, add_client_commands, run
from streamingnode.cli.parsing import CliError, parse_record, parse_where

__all__ = ["CLIENT_COMMANDS", "DEFAULT_ADDR", "CliError", "add_client_commands", "parse_record", "parse_where", "run"]
