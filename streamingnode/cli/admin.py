"""``streamingnode channels``, ``groups`` and ``flush``: the admin commands, as tables or JSON.

Standard library only at module level (see ``streamingnode.cli``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from streamingnode.cli.connection import connect
from streamingnode.cli.parsing import CliError, parse_where, ts_text

if TYPE_CHECKING:
    from streamingnode.client import ChannelDescription, GroupDescription


# --- channels ------------------------------------------------------------------------------------
def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [headers, *rows]]
    return "\n".join(lines)


def _dump(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _id_text(mid: int | None) -> str:
    return "-" if mid is None else str(mid)


def channel_json(d: ChannelDescription) -> dict[str, Any]:
    """What ``channels list/describe --json`` prints for one channel."""
    return {
        "name": d.name,
        "owner": {"role": d.owner.role, "address": d.owner.address, "description": d.owner.description},
        "term": d.term, "first_id": d.first_id, "last_id": d.last_id, "last_timetick": d.last_timetick,
        "state": d.state, "failure": d.failure,
        "failure_code": None if d.failure_code is None else d.failure_code.name, "problems": list(d.problems),
    }


def _channel_rows(descriptions: list[ChannelDescription]) -> str:
    rows = [[d.name, str(d.term), _id_text(d.first_id), _id_text(d.last_id),
             str(0 if d.first_id is None or d.last_id is None else d.last_id - d.first_id + 1),
             ts_text(d.last_timetick), d.owner.role or "-", d.state] for d in descriptions]
    return _table(["NAME", "TERM", "FIRST_ID", "LAST_ID", "MESSAGES", "LAST_TIME", "OWNER", "STATE"], rows)


async def channels_create(args: argparse.Namespace, addr: str) -> int:
    """Run ``channels create``; the exit code."""
    from streamingnode.client import Owner  # noqa: PLC0415

    if bool(args.names) == bool(args.num):
        raise CliError("channels create: give channel NAMEs or --num N (not both)")
    client = await connect(addr)
    existing: list[str] = []
    try:
        wanted = list(args.names)
        if args.if_not_exists and wanted:
            known = {d.name for d in await client.describe_channels()}
            existing = [n for n in wanted if n in known]
            wanted = [n for n in wanted if n not in known]
        names = await client.create_channels(wanted, args.num or 0,
                                              owner=Owner(args.role, args.address, args.description)) \
            if wanted or args.num else []
    finally:
        await client.aclose()
    if args.json:
        _dump(names)
    else:
        print("\n".join([*(f"exists {n}" for n in existing), *(f"created {n}" for n in names)]))
    return 0


async def channels_list(args: argparse.Namespace, addr: str) -> int:
    """Run ``channels list``; the exit code."""
    client = await connect(addr)
    try:
        descriptions = await client.describe_channels()
    finally:
        await client.aclose()
    if args.json:
        _dump([channel_json(d) for d in descriptions])
    elif descriptions:
        print(_channel_rows(descriptions))
    else:
        print("no channels", file=sys.stderr)
    return 0


async def channels_describe(args: argparse.Namespace, addr: str) -> int:
    """Run ``channels describe``; the exit code."""
    client = await connect(addr)
    try:
        descriptions = await client.describe_channels(args.names)
    finally:
        await client.aclose()
    if args.json:
        _dump([channel_json(d) for d in descriptions])
        return 0
    blocks = []
    for d in descriptions:
        owner = ", ".join(f"{k}={v}" for k, v in (("role", d.owner.role), ("address", d.owner.address),
                                                  ("description", d.owner.description)) if v) or "-"
        blocks.append(_table(["FIELD", "VALUE"], [
            ["name", d.name], ["owner", owner], ["term", str(d.term)],
            ["first_id", _id_text(d.first_id)], ["last_id", _id_text(d.last_id)],
            ["last_timetick", f"{d.last_timetick} ({ts_text(d.last_timetick)})"],
            ["state", d.state], *([["failure", d.failure]] if d.failure else []),
            *(["problem", p] for p in d.problems),
        ]).split("\n", 1)[1])  # the header adds nothing to a key/value list
    print("\n\n".join(blocks))
    return 0


async def channels_destroy(args: argparse.Namespace, addr: str) -> int:
    """Run ``channels destroy``; the exit code."""
    client = await connect(addr)
    try:
        await client.destroy_channels(args.names)
    finally:
        await client.aclose()
    print("\n".join(f"destroyed {n}" for n in args.names))
    return 0


# --- groups --------------------------------------------------------------------------------------
def group_json(g: GroupDescription) -> dict[str, Any]:
    """What ``groups describe --json`` prints for one group."""
    return {"pchannel": g.pchannel, "group": g.group, "vchannels": [
        {"vchannel": p.vchannel, "committed": {"message_id": p.committed.message_id,
                                               "timetick": p.committed.timetick},
         "lag_messages": p.lag_messages, "lag_ms": p.lag_ms, **({"problem": p.problem} if p.problem else {})}
        for p in g.vchannels]}


async def groups_create(args: argparse.Namespace, addr: str) -> int:
    """Run ``groups create``; the exit code."""
    from wal.errors import ConsumerGroupExistError  # noqa: PLC0415

    client = await connect(addr)
    try:
        existing: set[str] = set()
        if args.if_not_exists:
            # Asked first, as channels create does: a create refused as a duplicate would be a refusal
            # the node logs at WARNING and counts, on every run of a script.  Across every pchannel
            # (admin, as the create itself needs) rather than of this one, which needs consume on it.
            existing = {g.group for g in await client.describe_groups("", args.names) if g.pchannel == args.channel}
        for name in args.names:
            if name not in existing:
                try:
                    await client.create_group(args.channel, name)
                except ConsumerGroupExistError:  # created in between by someone else
                    if not args.if_not_exists:
                        raise
                else:
                    print(f"created group {name} on {args.channel}")
                    continue
            print(f"group {name} exists on {args.channel}")
    finally:
        await client.aclose()
    return 0


async def groups_destroy(args: argparse.Namespace, addr: str) -> int:
    """Run ``groups destroy``; the exit code."""
    client = await connect(addr)
    try:
        for name in args.names:
            await client.destroy_group(args.channel, name)
            print(f"destroyed group {name} on {args.channel}")
    finally:
        await client.aclose()
    return 0


async def _describe_groups(args: argparse.Namespace, addr: str, names: list[str]) -> list[GroupDescription]:
    client = await connect(addr)
    try:
        return await client.describe_groups(args.channel, names)
    finally:
        await client.aclose()


async def groups_list(args: argparse.Namespace, addr: str) -> int:
    """Run ``groups list``; the exit code."""
    groups = await _describe_groups(args, addr, [])
    if args.json:
        _dump([{"pchannel": g.pchannel, "group": g.group} for g in groups])
    elif groups:
        print(_table(["PCHANNEL", "GROUP", "VCHANNELS"], [
            [g.pchannel, g.group, ",".join(repr(p.vchannel) for p in g.vchannels) or "-"] for g in groups]))
    else:
        print("no consumer groups", file=sys.stderr)
    return 0


async def _missing_groups(args: argparse.Namespace, addr: str, groups: list[GroupDescription]) -> None:
    """Raise CliError naming the groups ``args.names`` asked for that no pchannel has.

    Only a describe across every pchannel can miss one silently (the node lists a named group where
    it exists); with --channel the node refuses an unknown group itself.  A name that is a pchannel's
    is most likely a --channel forgotten: the error says so.
    """
    from wal.errors import StreamingError  # noqa: PLC0415

    found = {g.group for g in groups}
    missing = [n for n in dict.fromkeys(args.names) if n not in found]
    if not missing:
        return
    hint = ""
    client = await connect(addr)
    try:
        pchannels = {d.name for d in await client.describe_channels()}
    except StreamingError:
        pchannels = set()  # not allowed to list them: no hint, the error stands
    finally:
        await client.aclose()
    named = [n for n in missing if n in pchannels]
    if named:
        hint = f" ({named[0]!r} is a pchannel: did you mean --channel {named[0]}?)"
    listed = " or ".join(repr(n) for n in missing)
    raise CliError(f"no pchannel has a consumer group named {listed}{hint}")


async def groups_describe(args: argparse.Namespace, addr: str) -> int:
    """Run ``groups describe``; the exit code (1 when a named group is found on no pchannel)."""
    groups = await _describe_groups(args, addr, args.names)
    if args.json:
        _dump([group_json(g) for g in groups])
        await _missing_groups(args, addr, groups)
        return 0
    rows: list[list[str]] = []
    for g in groups:
        if not g.vchannels:
            rows.append([g.pchannel, g.group, "-", "-", "-", "-", "-"])  # created, never consumed or sought
        rows.extend([g.pchannel, g.group, repr(p.vchannel), str(p.committed.message_id),
                     ts_text(p.committed.timetick), str(p.lag_messages), str(p.lag_ms)] for p in g.vchannels)
    if rows:
        print(_table(["PCHANNEL", "GROUP", "VCHANNEL", "COMMITTED_ID", "COMMITTED_TIME", "LAG_MSGS", "LAG_MS"],
                     rows))
    elif not args.names:
        print("no consumer groups", file=sys.stderr)
    for g in groups:
        for p in g.vchannels:
            if p.problem:  # opening the group there fails: say so, and how to repair it
                print(f"problem: group {g.group!r} of pchannel {g.pchannel!r}, vchannel {p.vchannel!r}: {p.problem}; "
                      f"repair with: groups seek --channel {g.pchannel} --vchannel {p.vchannel!r} {g.group!r} "
                      "--to earliest|latest|...", file=sys.stderr)
    await _missing_groups(args, addr, groups)
    return 0


async def groups_seek(args: argparse.Namespace, addr: str) -> int:
    """Run ``groups seek``; the exit code."""
    policy = parse_where(args.target, "--to")
    client = await connect(addr)
    try:
        pos = await client.seek_group(args.channel, args.name, args.vchannel, policy=policy)
    finally:
        await client.aclose()
    if args.json:
        _dump({"pchannel": pos.pchannel, "vchannel": args.vchannel, "message_id": pos.message_id,
               "timetick": pos.timetick})
    else:
        print(f"group {args.name} on {args.channel} vchannel {args.vchannel!r} now at message id "
              f"{pos.message_id}, timetick {pos.timetick} ({ts_text(pos.timetick)})")
    return 0


# --- flush ---------------------------------------------------------------------------------------
async def flush(args: argparse.Namespace, addr: str) -> int:
    """Run ``flush``; the exit code."""
    client = await connect(addr)
    try:
        files, flush_ts = await client.flush(args.channel, args.vchannel, args.collection)
    finally:
        await client.aclose()
    if args.json:
        _dump({"files": files, "flush_timetick": flush_ts})
    else:
        print(f"flush timetick {flush_ts} ({ts_text(flush_ts)})")
        print(f"{len(files)} file(s)" + "".join(f"\n  {f}" for f in files))
    return 0


__all__ = [
    "channel_json",
    "channels_create",
    "channels_describe",
    "channels_destroy",
    "channels_list",
    "flush",
    "group_json",
    "groups_create",
    "groups_describe",
    "groups_destroy",
    "groups_list",
    "groups_seek",
]
